"""Which of the sink's tables a maintenance run does first: those that gain most, scored from metadata
that loading a table already read (the current snapshot's summary and the snapshot list), never from
a scan of its manifests. At thousands of tables a run may stop at its ``max-duration`` before it
reaches every table; the tables it did not reach keep their gain and come first next time.

Per table and action:

- compaction: the data files a bin-pack rewrite to the target size would remove (data files minus
  the files their bytes fill at the target) when the files average below 75% of the target (the
  small files a day of commits leaves), plus the delete files it would fold;
- expiry: the snapshots ``expire_snapshots`` would remove (:func:`decisions.expirable_snapshots`);
- orphans: the time since the table's last complete maintenance (``last-run-ms``), which breaks
  ties: a table never maintained, then the one waiting longest.

The score is the sum of the first two: each is a file or a snapshot that every reader and every
commit carries until maintenance removes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyiceberg.table import Table

from fanout_sink.config.maintenance import MaintenanceSettings
from fanout_sink.maintenance import decisions
from fanout_sink.protocol import orphans, table_state


@dataclass(frozen=True)
class Gain:
    """What maintaining one table now would remove, as its metadata tells it."""

    table: str
    compaction: int
    """Data files a rewrite to the target size would remove, plus the delete files it would fold."""
    expiry: int
    """Snapshots past ``max-snapshot-age`` beyond ``min-snapshots-to-keep``."""
    since_last_run_s: float | None
    """Since the last complete maintenance; None: never maintained."""

    @property
    def score(self) -> int:
        return self.compaction + self.expiry

    def describe(self) -> str:
        """``sink.t (compaction 47, expiry 30)``: what the order was decided on."""
        return f"{self.table} (compaction {self.compaction}, expiry {self.expiry})"


def compaction_gain(table: Table, settings: MaintenanceSettings) -> int:
    """The files a bin-pack rewrite would remove, estimated from the current snapshot's summary:
    ``total-data-files`` minus ``ceil(total-files-size / target)`` when they average below 75% of
    the target and number at least ``min-input-files``; plus ``total-delete-files``."""
    figures = decisions.figures(table)
    target = decisions.target_file_size(table, settings)
    merged = 0
    if figures.data_files >= settings.min_input_files and figures.bytes < (
        figures.data_files * target * decisions.SMALL_FILE_RATIO
    ):
        merged = figures.data_files - max(1, math.ceil(figures.bytes / target))
    return merged + figures.delete_files


def expiry_gain(table: Table, settings: MaintenanceSettings, now_ms: int) -> int:
    """The snapshots an expiry now would remove (none when the table's garbage collection is off)."""
    if orphans.gc_disabled(table):
        return 0
    age = decisions.max_snapshot_age(table, settings)
    keep = decisions.min_snapshots_to_keep(table, settings)
    return decisions.expirable_snapshots(table, int(now_ms - age.total_seconds() * 1000), keep)


def gain(identifier: str, table: Table, settings: MaintenanceSettings, now_ms: int) -> Gain:
    last = table.metadata.properties.get(table_state.MAINTENANCE_LAST_RUN_MS)
    return Gain(
        table=identifier,
        compaction=compaction_gain(table, settings),
        expiry=expiry_gain(table, settings, now_ms),
        since_last_run_s=(now_ms - int(last)) / 1000 if last is not None else None,
    )


def by_gain(gains: Sequence[Gain]) -> list[Gain]:
    """Highest score first; on a tie the table never maintained, then the one waiting longest, then
    by name (so that the order is the same from run to run)."""
    return sorted(
        gains,
        key=lambda g: (
            -g.score,
            g.since_last_run_s is not None,
            -(g.since_last_run_s or 0.0),
            g.table,
        ),
    )


def rank(
    tables: Sequence[tuple[str, Table]],
    settings_for: Callable[[str], MaintenanceSettings],
    now_ms: int | None = None,
) -> list[Gain]:
    """The tables' gains, the order to maintain them in."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return by_gain([gain(identifier, table, settings_for(identifier), now) for identifier, table in tables])
