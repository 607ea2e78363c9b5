"""What a maintenance run did, per table and step: the records the run keeps, the app logs and
``fanout-sink maintain`` prints (:func:`render_text`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from fanout_sink.maintenance.decisions import Figures, span
from fanout_sink.maintenance.priority import Gain

StepName = Literal["load", "compact", "deletes", "manifests", "expire", "orphans", "last-run"]
StepAction = Literal["ran", "skipped", "failed", "dry-run"]


@dataclass(frozen=True)
class Step:
    name: StepName
    action: StepAction
    detail: str
    """Why it was skipped, what it did (the procedure's counts), or the error."""
    duration_s: float = 0.0


@dataclass(frozen=True)
class TableMaintenance:
    """What one maintenance run did to one table."""

    table: str
    before: Figures
    after: Figures
    steps: tuple[Step, ...]
    orphans_removed: tuple[str, ...] = ()
    """Paths removed (in a dry run: that would be removed)."""
    duration_s: float = 0.0
    floor_written: dict[str, str] = field(default_factory=dict)
    """The sink state written as table properties before expiry (tables committed before the sink
    set them)."""

    @property
    def ok(self) -> bool:
        return all(step.action != "failed" for step in self.steps)

    @property
    def skipped(self) -> dict[str, str]:
        return {step.name: step.detail for step in self.steps if step.action == "skipped"}


@dataclass(frozen=True)
class MaintenanceRun:
    """A whole run: what it did per table, in the order it took them, and the tables it did not
    reach before its ``max-duration``."""

    results: tuple[TableMaintenance, ...]
    left: tuple[Gain, ...]
    """By gain: the order the next run takes them in, unless their gains change."""
    max_duration: timedelta | None
    duration_s: float

    def line(self) -> str:
        """The run in one line: how many tables in how long and, when it stopped at its budget,
        what is left."""
        done = len(self.results)
        line = f"maintained {done} of {done + len(self.left)} table(s) in {self.duration_s:.1f}s"
        if self.left and self.max_duration is not None:
            line += (
                f"; max-duration {span(self.max_duration)} reached: {len(self.left)} left, "
                f"first next time {self.left[0].describe()}"
            )
        return line


def table_line(r: TableMaintenance) -> str:
    """One table's run in one line: its figures before and after, orphans, time; the scheduled
    maintenance inside ``run`` logs it per table, ``maintain`` prints it above the table's steps."""
    return (
        f"{r.table}: data files {r.before.data_files} -> {r.after.data_files}, "
        + (
            f"delete files {r.before.delete_files} -> {r.after.delete_files} (position deletes "
            f"{r.before.position_deletes} -> {r.after.position_deletes}), "
            if r.before.delete_files or r.after.delete_files
            else ""
        )
        + f"bytes {r.before.bytes} -> {r.after.bytes}, "
        f"snapshots {r.before.snapshots} -> {r.after.snapshots}, "
        f"manifests {r.before.manifests} -> {r.after.manifests}, orphans {len(r.orphans_removed)}, "
        f"{r.duration_s:.1f}s" + ("" if r.ok else " (some steps failed)")
    )


def failed_steps(results: Sequence[TableMaintenance]) -> list[str]:
    """``table step: cause`` of every failed step."""
    return [f"{r.table} {s.name}: {s.detail}" for r in results for s in r.steps if s.action == "failed"]


def render_text(results: Sequence[TableMaintenance]) -> str:
    """The short per-table summary ``fanout-sink maintain`` prints: the only account of each step
    (the log has them at DEBUG)."""
    if not results:
        return "no table holds a commit of this sink yet: nothing to maintain"
    lines = []
    for r in results:
        lines.append(table_line(r))
        lines += [f"  {step.name}: {step.action} {step.detail}" for step in r.steps]
    return "\n".join(lines)
