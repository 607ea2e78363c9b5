"""Table maintenance next to the running sink, carried out: compaction, delete-file and manifest
rewrites and snapshot expiry by Iceberg's Spark procedures, then orphan cleanup.

``maintain`` keeps every table this sink commits to healthy (or the ones named). What each step
should do is decided from PyIceberg metadata before Spark is asked to do anything
(``fanout_sink/maintenance/decisions.py``); what the run did is kept and printed as
``fanout_sink/maintenance/report.py`` says. The sink's floor (``table_state``) must outlive its
snapshots, so table properties that do not carry it as far as the ancestry are written before
expiry. Orphan cleanup is :mod:`fanout_sink.protocol.orphans` (without Spark), which also protects
files a committed control event still waits to have appended.

Why Spark for the rewrites and expiry: Iceberg Java's actions rewrite in parallel, and their commits
retry on conflict (``commit.retry.num-retries``) and validate against concurrent appends, so they are
safe next to the coordinator, whose appends re-check the floor and retry themselves. A bin-pack
rewrite never conflicts with an append. Each step that fails is recorded and logged; the others
still run.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import TableError
from fanout_sink.maintenance import decisions, local_compaction, local_expiry, priority
from fanout_sink.maintenance.decisions import NO_FIGURES, Decision, Figures, span
from fanout_sink.maintenance.report import MaintenanceRun, Step, StepAction, StepName, TableMaintenance
from fanout_sink.protocol import group_layout, orphans, table_state

log = logging.getLogger("fanout_sink.maintenance")

SHORT_ORPHAN_AGE = timedelta(hours=1)


def _quote(identifier: str) -> str:
    return ".".join(f"`{part}`" for part in identifier.split("."))


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _options(options: dict[str, str]) -> str:
    """A procedure's ``options`` argument: ``map('k', 'v', ...)``."""
    return "map(" + ", ".join(f"{_sql_string(k)}, {_sql_string(v)}" for k, v in options.items()) + ")"


def _row(spark: Any, sql: str) -> dict[str, Any]:
    rows = spark.sql(sql).collect()
    return rows[0].asDict() if rows else {}


def _counts(row: dict[str, Any]) -> str:
    """A procedure's result row, or an in-process step's counts under the same names, as one line."""
    return " ".join(f"{key}={value}" for key, value in row.items())


class _TableRun:
    """One table's steps, with their timings, in one maintenance run."""

    def __init__(
        self, spark: Any, catalog: Catalog, config: SinkConfig, identifier: str, stop: threading.Event | None
    ) -> None:
        self.started = time.monotonic()
        self.spark = spark
        self.stop = stop
        self.catalog = catalog
        self.sink = config.name
        self.identifier = identifier
        self.settings = config.maintenance_for(identifier)
        self.qualified = f"`{config.catalog.name}`.{_quote(identifier)}"
        self.procedures = f"`{config.catalog.name}`.system"
        # Catalog-qualified: a bare `ns.table` makes Iceberg try `ns` as a catalog first (a WARNING
        # with a stack trace per call).
        self.argument = _sql_string(f"{config.catalog.name}.{identifier}")
        self.steps: list[Step] = []
        self.floor_written: dict[str, str] = {}
        self.before: Figures | None = None
        self._table: Table | None = None

    @property
    def stopping(self) -> bool:
        """The app is stopping: the remaining steps are skipped."""
        return self.stop is not None and self.stop.is_set()

    def record(self, name: StepName, action: StepAction, detail: str, started: float) -> None:
        step = Step(name, action, detail, time.monotonic() - started)
        self.steps.append(step)
        if action == "ran":
            self._table = None  # the step committed: the next one loads the table again
        # DEBUG: the run's report says each step once (``maintain`` prints it, ``run`` logs a line per
        # table and an ERROR naming the failed steps with their causes).
        log.debug("maintenance %s %s: %s %s (%.1fs)", self.identifier, name, action, detail, step.duration_s)

    def measure(self) -> Figures | None:
        """The table's figures now; None (and a failed step) when it cannot be loaded."""
        started = time.monotonic()
        try:
            self._table = self.catalog.load_table(self.identifier)
            return decisions.figures(self._table)
        except Exception as exc:
            self.record("load", "failed", f"{type(exc).__name__}: {exc}", started)
            return None

    def loaded(self) -> Table:
        """The table as this run last loaded it, loaded again once a step changed it (a sink commit
        since only makes a decision miss the newest files, as it would a moment earlier)."""
        if self._table is None:
            self._table = self.catalog.load_table(self.identifier)
        return self._table

    def refresh(self) -> Table:
        # Spark's catalog caches tables: the sink committed since, so see its latest metadata.
        self.spark.sql(f"REFRESH TABLE {self.qualified}")
        return self.catalog.load_table(self.identifier)

    def rewrite(self, dry_run: bool) -> None:
        """The table's figures before, then compaction, delete-file rewrite, manifest rewrite and
        expiry, each guarded; none of them when the table cannot be loaded (dropped since it was
        listed, or its metadata cannot be read)."""
        self.before = self.measure()
        if self.before is None:
            return
        self.guarded("compact", self.compact, dry_run)
        self.guarded("deletes", self.compact_deletes, dry_run)
        self.guarded("manifests", self.rewrite_manifests, dry_run)
        self.guarded("expire", self.expire, dry_run)

    def decided(self, name: StepName, decision: Decision, dry_run: bool, started: float) -> bool:
        """True when the step is to run; otherwise records why not (it does not pay) or, in a dry run,
        what it would do."""
        if not decision.due:
            self.record(name, "skipped", decision.detail, started)
        elif dry_run:
            self.record(name, "dry-run", decision.detail, started)
        return decision.due and not dry_run

    def compact(self, dry_run: bool) -> None:
        started = time.monotonic()
        table = self.loaded()
        decision = decisions.compaction(table, self.settings)
        if not self.decided("compact", decision, dry_run, started):
            return
        if local_compaction.refusal(table, self.settings.sort_order) is None:
            done = local_compaction.compact(
                lambda: self.catalog.load_table(self.identifier),
                int(decision.options["target-file-size-bytes"]),
                self.settings.min_input_files,
            )
            if done is not None:
                counts = _counts(asdict(done))
                self.record("compact", "ran", f"{decision.detail}: {counts} (in-process)", started)
                return
        self.refresh()
        sort = ""
        if self.settings.sort_order is not None:
            sort = f", strategy => 'sort', sort_order => {_sql_string(self.settings.sort_order)}"
        row = _row(
            self.spark,
            f"CALL {self.procedures}.rewrite_data_files(table => {self.argument}{sort}, "
            f"options => {_options(decision.options)})",
        )
        self.record("compact", "ran", decision.detail + ": " + _counts(row), started)

    def compact_deletes(self, dry_run: bool) -> None:
        """``rewrite_position_delete_files`` where it pays (:func:`decisions.delete_rewrite`),
        ``rewrite-all``, since Iceberg's own selection by file count per partition also rewrites
        delete files that are one per data file already."""
        started = time.monotonic()
        decision = decisions.delete_rewrite(self.loaded(), self.settings)
        if not self.decided("deletes", decision, dry_run, started):
            return
        self.refresh()
        options = {"rewrite-all": "true", "partial-progress.enabled": "true"}
        row = _row(
            self.spark,
            f"CALL {self.procedures}.rewrite_position_delete_files(table => {self.argument}, "
            f"options => {_options(options)})",
        )
        self.record("deletes", "ran", f"{decision.detail}: {_counts(row)}", started)

    def rewrite_manifests(self, dry_run: bool) -> None:
        started = time.monotonic()
        decision = decisions.manifest_rewrite(self.loaded(), self.settings)
        if not self.decided("manifests", decision, dry_run, started):
            return
        self.refresh()
        row = _row(self.spark, f"CALL {self.procedures}.rewrite_manifests(table => {self.argument})")
        self.record("manifests", "ran", _counts(row), started)

    def expire(self, dry_run: bool) -> None:
        started = time.monotonic()
        table = self.loaded()
        decision = decisions.expiry(table, self.settings)
        if not self.decided("expire", decision, dry_run, started):
            return
        # The floor must survive: its snapshots are about to go.
        self.floor_written = table_state.persist_state(self.catalog, self.identifier, self.sink)
        if self.floor_written:
            log.info(
                "maintenance %s: wrote the sink's state as table properties before expiry: %s",
                self.identifier,
                self.floor_written,
            )
        if local_expiry.refusal(table) is None:
            expired = local_expiry.expire(
                self.catalog, self.identifier, decision.older_than_ms, decision.keep
            )
            self.record("expire", "ran", _counts(asdict(expired)) + " (in-process)", started)
            return
        self.refresh()
        older_than = dt.datetime.fromtimestamp(decision.older_than_ms / 1000, tz=dt.UTC)
        row = _row(
            self.spark,
            f"CALL {self.procedures}.expire_snapshots(table => {self.argument}, "
            f"older_than => TIMESTAMP {_sql_string(older_than.strftime('%Y-%m-%d %H:%M:%S.%f+00:00'))}, "
            f"retain_last => {decision.keep})",
        )
        self.record("expire", "ran", _counts(row), started)

    def guarded(self, name: StepName, action: Any, *args: Any) -> None:
        started = time.monotonic()
        if self.stopping:
            self.record(name, "skipped", "the app is stopping", started)
            return
        try:
            action(*args)
        except Exception as exc:  # a failed step is reported; the next steps and tables still run
            self.record(
                name,
                "failed",
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                started,
            )

    def mark_done(self) -> None:
        now_ms = int(time.time() * 1000)
        table_state.set_property(
            self.catalog, self.identifier, table_state.MAINTENANCE_LAST_RUN_MS, str(now_ms)
        )

    def record_orphans(self, cleanup: _OrphanCleanup, dry_run: bool) -> None:
        """The orphan cleanup's step for this table, from the cleanup of all tables."""
        result = cleanup.results.get(self.identifier)
        action: StepAction
        if result is not None and result.refused is not None:
            detail, action = result.refused, "skipped"
        elif cleanup.failure is not None or result is None or result.error is not None:
            detail = cleanup.failure or (result.error if result is not None else "not run") or ""
            action = "failed"
        else:
            verb = "would remove" if dry_run else "removed"
            detail = (
                f"{verb} {len(result.removed)} of {result.listed} files, kept {result.kept_pending} pending "
                f"and {result.kept_fresh} younger than {span(self.settings.orphan_older_than)}"
                + (f", {len(result.failed)} failed to delete" if result.failed else "")
            )
            action = "dry-run" if dry_run else "ran"
        if self.stopping:
            action, detail = "skipped", "the app is stopping"
        self.record("orphans", action, detail, cleanup.started)

    def mark_last_run(self, dry_run: bool) -> None:
        """The ``last-run-ms`` property, unless a step failed, the app is stopping or this is a dry run
        (so ``status`` shows the last complete maintenance)."""
        if not dry_run and not self.stopping and all(step.action != "failed" for step in self.steps):
            self.guarded("last-run", self.mark_done)

    def outcome(self, cleanup: _OrphanCleanup, dry_run: bool) -> TableMaintenance:
        """What the run did to this table, with its figures after."""
        after = self.measure() or NO_FIGURES
        outcome = TableMaintenance(
            table=self.identifier,
            before=self.before or NO_FIGURES,
            after=after,
            steps=tuple(self.steps),
            orphans_removed=cleanup.removed(self.identifier),
            duration_s=time.monotonic() - self.started,
            floor_written=self.floor_written,
        )
        return outcome


@dataclass(frozen=True)
class _OrphanCleanup:
    """The orphan cleanup of all tables at once (one read of the control topic for all of them)."""

    results: dict[str, orphans.OrphanResult]
    failure: str | None
    """Why no table was cleaned (the control topic could not be read, or the app is stopping)."""
    started: float

    def removed(self, identifier: str) -> tuple[str, ...]:
        """Paths removed from the table (in a dry run: that would be removed)."""
        result = self.results.get(identifier)
        return result.removed if result is not None else ()


def _warn_short_orphan_ages(runs: Sequence[_TableRun]) -> None:
    """A WARNING per table whose ``orphan-older-than`` is under :data:`SHORT_ORPHAN_AGE`."""
    for run in runs:
        age = run.settings.orphan_older_than
        if age < SHORT_ORPHAN_AGE:
            log.warning(
                "maintenance %s: orphan-older-than %s is under 1h: a worker's data files are unannounced "
                "until its transaction commits, so a slice that takes longer than that loses its files; "
                "fix: keep orphan-older-than at hours or days outside tests",
                run.identifier,
                span(age),
            )


def _clean_orphans(
    catalog: Catalog,
    config: SinkConfig,
    runs: Sequence[_TableRun],
    dry_run: bool,
    stop: threading.Event | None,
) -> _OrphanCleanup:
    """Orphan cleanup of every table, each with its own ``orphan-older-than``; nothing is removed when
    the control topic cannot be read."""
    started = time.monotonic()
    try:
        if stop is not None and stop.is_set():
            raise InterruptedError("the app is stopping")
        cleaned = orphans.clean_tables(
            catalog,
            {run.identifier: run.settings.orphan_older_than for run in runs},
            lambda: orphans.pending_files(group_layout.channel_in_use(config)),
            dry_run,
        )
    except Exception as exc:  # the control topic could not be read: nothing is removed
        return _OrphanCleanup({}, f"{type(exc).__name__}: {exc}", started)
    return _OrphanCleanup(cleaned, None, started)


def _selected(
    found: Sequence[table_state.SinkTable], sink: str, tables: Sequence[str] | None
) -> list[table_state.SinkTable]:
    """The sink's tables, or the named ones (each must be a sink table)."""
    if tables is None:
        return list(found)
    by_name = {t.identifier: t for t in found}
    unknown = [t for t in tables if t not in by_name]
    if unknown:
        raise TableError(
            f"table(s) {', '.join(unknown)} hold no commit of sink {sink!r}; maintain works on the sink's "
            f"own tables ({', '.join(by_name) or 'none yet'})\n"
            "  fix: name one of those with --table, or omit --table"
        )
    return [by_name[t] for t in dict.fromkeys(tables)]


def select_tables(catalog: Catalog, sink: str, tables: Sequence[str] | None) -> list[str]:
    """The tables to maintain: the sink's tables, or the named ones (each must be a sink table)."""
    return [t.identifier for t in _selected(table_state.sink_tables(catalog, sink), sink, tables)]


def maintain(
    spark: Any,
    config: SinkConfig,
    tables: Sequence[str] | None = None,
    dry_run: bool = False,
    stop: threading.Event | None = None,
) -> list[TableMaintenance]:
    """What :func:`maintain_run` did per table."""
    return list(maintain_run(spark, config, tables, dry_run, stop).results)


def maintain_run(
    spark: Any,
    config: SinkConfig,
    tables: Sequence[str] | None = None,
    dry_run: bool = False,
    stop: threading.Event | None = None,
) -> MaintenanceRun:
    """Maintain the sink's tables (or ``tables``), those that gain most first
    (:mod:`fanout_sink.maintenance.priority`): per table compaction, manifest rewrite and expiry,
    then orphan cleanup of the tables done, then the ``last-run-ms`` property where no step failed
    (so ``status`` shows the last complete maintenance). Once ``maintenance.max-duration`` has passed
    no new table is started; the run says which are left. ``dry_run`` decides and reports without
    changing anything (the orphans listed are those that would be removed). Once ``stop`` is set (the
    app is stopping), the remaining steps are skipped."""
    started = time.monotonic()
    budget = config.maintenance.max_duration
    catalog = load_catalog(config.catalog, create=False)
    selected = _selected(table_state.sink_tables(catalog, config.name), config.name, tables)
    order = priority.rank([(t.identifier, t.table) for t in selected], config.maintenance_for)
    runs: list[_TableRun] = []
    for gain in order:
        if runs and budget is not None and time.monotonic() - started >= budget.total_seconds():
            break
        run = _TableRun(spark, catalog, config, gain.table, stop)
        run.rewrite(dry_run)
        runs.append(run)
    _warn_short_orphan_ages(runs)
    cleanup = _clean_orphans(catalog, config, runs, dry_run, stop)
    results = []
    for run in runs:
        run.record_orphans(cleanup, dry_run)
        run.mark_last_run(dry_run)
        results.append(run.outcome(cleanup, dry_run))
    return MaintenanceRun(
        results=tuple(results),
        left=tuple(order[len(runs) :]),
        max_duration=budget,
        duration_s=time.monotonic() - started,
    )
