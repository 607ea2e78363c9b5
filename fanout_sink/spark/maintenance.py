"""Table maintenance next to the running sink: compaction, manifest rewrite, snapshot expiry, orphans.

``maintain`` keeps every table this sink commits to healthy (or the ones named). Each step runs only
where it pays, decided from PyIceberg metadata before Spark is asked to do anything:

- compaction (Iceberg's ``rewrite_data_files``, bin-pack or sorted by ``sort-order``) when some
  partition holds at least ``min-input-files`` files below 75% of the target size (Iceberg's own
  ``min-file-size-bytes`` default, so the procedure picks the same files), or when some data file
  carries position deletes at or over ``delete-file-threshold`` / ``delete-ratio-threshold``: the
  rewrite folds them into the data (merge-on-read change tables) and drops the deletes left dangling;
- ``rewrite_position_delete_files`` when delete files remain that compaction did not fold and some
  data file has several of them, or some are dangling (they name no live data file);
- ``rewrite_manifests`` when the current snapshot has at least ``rewrite-manifests-min-count`` manifests;
- ``expire_snapshots`` when snapshots older than the age exist beyond the kept count. The sink's floor
  (``table_state``) must outlive its snapshots, so table properties that do not carry it as far as
  the ancestry are written first;
- orphan cleanup by :mod:`fanout_sink.protocol.orphans` (without Spark), which also protects files a
  committed control event still waits to have appended.

Why Spark for the first three: Iceberg Java's actions rewrite in parallel, and their commits retry on
conflict (``commit.retry.num-retries``) and validate against concurrent appends, so they are safe next
to the coordinator, whose appends re-check the floor and retry themselves. A bin-pack rewrite never
conflicts with an append. Each step that fails is recorded and logged; the others still run.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import Table

from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import MaintenanceSettings, SinkConfig
from fanout_sink.errors import TableError
from fanout_sink.protocol import group_layout, orphans, table_state
from fanout_sink.protocol.position_deletes import FILE_PATH_ID

log = logging.getLogger("fanout_sink.maintenance")

ICEBERG_TARGET_FILE_SIZE = 512 * 1024 * 1024
"""Iceberg's ``write.target-file-size-bytes`` default."""
ICEBERG_MAX_SNAPSHOT_AGE = timedelta(days=5)
"""Iceberg's ``history.expire.max-snapshot-age-ms`` default."""
SMALL_FILE_RATIO = 0.75
"""Below this share of the target a file is worth rewriting (Iceberg's ``min-file-size-bytes`` default)."""
SHORT_ORPHAN_AGE = timedelta(hours=1)

StepName = Literal["load", "compact", "deletes", "manifests", "expire", "orphans", "last-run"]
StepAction = Literal["ran", "skipped", "failed", "dry-run"]


@dataclass(frozen=True)
class Figures:
    """A table's size as its current metadata tells it."""

    data_files: int
    bytes: int
    snapshots: int
    manifests: int
    """Of the current snapshot, those listing live files (see :func:`live_manifests`)."""
    delete_files: int = 0
    """Position-delete files of the current snapshot (merge-on-read change tables)."""
    position_deletes: int = 0
    """Rows those files delete."""


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


NO_FIGURES = Figures(0, 0, 0, 0)
"""What a table that could not be loaded counts."""


def figures(table: Table) -> Figures:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return Figures(0, 0, len(table.metadata.snapshots), 0)
    summary = snapshot.summary

    def total(key: str) -> int:
        return int(summary.get(key, 0)) if summary is not None else 0

    return Figures(
        data_files=total("total-data-files"),
        bytes=total("total-files-size"),
        snapshots=len(table.metadata.snapshots),
        manifests=live_manifests(table),
        delete_files=total("total-delete-files"),
        position_deletes=total("total-position-deletes"),
    )


def live_manifests(table: Table) -> int:
    """Manifests of the current snapshot that list live files. A rewrite's snapshot also lists the
    manifests of what it removed (only deleted entries), which the next commit drops: not counted."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    return sum(1 for m in snapshot.manifests(table.io) if m.has_added_files() or m.has_existing_files())


def target_file_size(table: Table, settings: MaintenanceSettings) -> int:
    if settings.target_file_size_bytes is not None:
        return settings.target_file_size_bytes
    return int(table.metadata.properties.get("write.target-file-size-bytes", ICEBERG_TARGET_FILE_SIZE))


def max_snapshot_age(table: Table, settings: MaintenanceSettings) -> timedelta:
    if settings.max_snapshot_age is not None:
        return settings.max_snapshot_age
    ms = table.metadata.properties.get("history.expire.max-snapshot-age-ms")
    return timedelta(milliseconds=int(ms)) if ms is not None else ICEBERG_MAX_SNAPSHOT_AGE


def min_snapshots_to_keep(table: Table, settings: MaintenanceSettings) -> int:
    if settings.min_snapshots_to_keep is not None:
        return settings.min_snapshots_to_keep
    return int(table.metadata.properties.get("history.expire.min-snapshots-to-keep", 1))


def compaction_candidates(table: Table, target: int, min_input_files: int) -> int:
    """The largest number of small files (below 75% of ``target``) in one partition of one spec."""
    if table.current_snapshot() is None:
        return 0
    files = table.inspect.data_files()
    small = files.filter(pc.less(files["file_size_in_bytes"], int(target * SMALL_FILE_RATIO)))
    if small.num_rows < min_input_files:
        return int(small.num_rows)
    flat = small.select(["spec_id", "partition"]).flatten()
    keys = [name for name in flat.column_names if name.startswith("partition.")] + ["spec_id"]
    counts = flat.group_by(keys).aggregate([("spec_id", "count")])
    return int(pc.max(counts["spec_id_count"]).as_py())


@dataclass(frozen=True)
class DeleteLoad:
    """How the live position deletes of a table weigh on its data files, matched as readers match
    them (PyIceberg's delete index: partition, sequence number and ``file_path`` bounds, the rules
    of Iceberg Java's ``DeleteFileIndex``), so the decision agrees with what ``rewrite_data_files``
    will select; but never to a data file added after the delete file, which no position of it can
    name (a compacted file between a delete file's bounds, see :func:`delete_load`)."""

    delete_files: int
    position_deletes: int
    data_files_with_deletes: int
    over_threshold: int
    """Data files that ``rewrite_data_files`` rewrites for their deletes alone: at least
    ``delete-file-threshold`` delete files, or file-scoped deletes covering at least
    ``delete-ratio-threshold`` of their rows (Iceberg counts only file-scoped ones for the ratio)."""
    dangling: int
    """Delete files matched to no live data file: every row they name is gone already."""
    most_per_data_file: int
    """The most delete files a reader opens for one data file (one per data file is the least:
    more are what ``rewrite_position_delete_files`` merges)."""


NO_DELETES = DeleteLoad(0, 0, 0, 0, 0, 0)


def _file_scoped_to(delete_file: DataFile, path: str) -> bool:
    """True when ``delete_file``'s ``file_path`` bounds are both ``path`` (Iceberg's file-scoped)."""
    lower, upper = delete_file.lower_bounds or {}, delete_file.upper_bounds or {}
    bound = path.encode()
    return lower.get(FILE_PATH_ID) == bound and upper.get(FILE_PATH_ID) == bound


def delete_load(table: Table, file_threshold: int, ratio_threshold: float) -> DeleteLoad:
    """The current snapshot's position deletes against ``delete-file-threshold`` and
    ``delete-ratio-threshold``, from PyIceberg metadata only (manifests; no data is read).

    Equality deletes (never written by this sink) make PyIceberg's planning raise; the error says so."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return NO_DELETES
    live: dict[str, DataFile] = {}
    added_in: dict[str, int] = {}  # file path -> sequence number of the snapshot that added the file
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            added_in[entry.data_file.file_path] = entry.file_sequence_number or 0
            if manifest.content == ManifestContent.DELETES:
                live[entry.data_file.file_path] = entry.data_file
    if not live:
        return NO_DELETES
    matched: set[str] = set()
    with_deletes = over = most = 0
    for task in table.scan().plan_files():
        # A position names a file that existed when its delete file was committed. Compaction gives
        # its files the sequence number of the snapshot it started from, so readers still match
        # them to that snapshot's delete files by their path bounds: not a delete, and not a reason
        # to keep the delete file or to compact the file again.
        deletes = [d for d in task.delete_files if added_in[d.file_path] >= added_in[task.file.file_path]]
        if not deletes:
            continue
        with_deletes += 1
        most = max(most, len(deletes))
        matched.update(d.file_path for d in deletes)
        scoped = sum(d.record_count for d in deletes if _file_scoped_to(d, task.file.file_path))
        ratio = (
            min(scoped, task.file.record_count) / task.file.record_count if task.file.record_count else 0.0
        )
        if len(deletes) >= file_threshold or ratio >= ratio_threshold:
            over += 1
    return DeleteLoad(
        delete_files=len(live),
        position_deletes=sum(d.record_count for d in live.values()),
        data_files_with_deletes=with_deletes,
        over_threshold=over,
        dangling=len(live.keys() - matched),
        most_per_data_file=most,
    )


def expirable_snapshots(table: Table, older_than_ms: int, keep: int) -> int:
    """How many snapshots ``expire_snapshots(older_than, retain_last=keep)`` would remove."""
    metadata = table.metadata
    kept = {ref.snapshot_id for ref in metadata.refs.values()}
    ancestor_id: int | None = metadata.current_snapshot_id
    for _ in range(keep):
        if ancestor_id is None:
            break
        kept.add(ancestor_id)
        ancestor = metadata.snapshot_by_id(ancestor_id)
        ancestor_id = ancestor.parent_snapshot_id if ancestor is not None else None
    return sum(1 for s in metadata.snapshots if s.timestamp_ms < older_than_ms and s.snapshot_id not in kept)


def _span(duration: timedelta) -> str:
    """``3d``, ``1h``, ``90s``: a duration as the YAML writes it."""
    seconds = duration.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


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

    @property
    def stopping(self) -> bool:
        """The app is stopping: the remaining steps are skipped."""
        return self.stop is not None and self.stop.is_set()

    def record(self, name: StepName, action: StepAction, detail: str, started: float) -> None:
        step = Step(name, action, detail, time.monotonic() - started)
        self.steps.append(step)
        level = logging.WARNING if action == "failed" else logging.INFO
        log.log(
            level, "maintenance %s %s: %s %s (%.1fs)", self.identifier, name, action, detail, step.duration_s
        )

    def measure(self) -> Figures | None:
        """The table's figures now; None (and a failed step) when it cannot be loaded."""
        started = time.monotonic()
        try:
            return figures(self.catalog.load_table(self.identifier))
        except Exception as exc:
            self.record("load", "failed", f"{type(exc).__name__}: {exc}", started)
            return None

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

    def compact(self, dry_run: bool) -> None:
        started = time.monotonic()
        settings = self.settings
        table = self.catalog.load_table(self.identifier)
        target = target_file_size(table, settings)
        found = compaction_candidates(table, target, settings.min_input_files)
        deletes = delete_load(table, settings.delete_file_threshold, settings.delete_ratio_threshold)
        thresholds = (
            f"delete-file-threshold {settings.delete_file_threshold} "
            f"or delete-ratio-threshold {settings.delete_ratio_threshold:g}"
        )
        if found < settings.min_input_files and deletes.over_threshold == 0:
            self.record(
                "compact",
                "skipped",
                f"at most {found} small file(s) in a partition, "
                f"below min-input-files {settings.min_input_files}"
                + (
                    f"; {deletes.data_files_with_deletes} data file(s) with deletes, none at {thresholds}"
                    if deletes.delete_files
                    else ""
                ),
                started,
            )
            return
        reasons = []
        if found >= settings.min_input_files:
            reasons.append(f"{found} small files in one partition (target {target} bytes)")
        if deletes.over_threshold:
            reasons.append(f"{deletes.over_threshold} data file(s) with deletes at {thresholds}")
        if dry_run:
            self.record("compact", "dry-run", "; ".join(reasons), started)
            return
        self.refresh()
        options = {
            "target-file-size-bytes": str(target),
            "min-input-files": str(settings.min_input_files),
            "partial-progress.enabled": "true",
        }
        if deletes.delete_files:  # a v2 table with deletes: fold them, drop the ones left dangling
            options |= {
                "delete-file-threshold": str(settings.delete_file_threshold),
                "delete-ratio-threshold": str(settings.delete_ratio_threshold),
                "remove-dangling-deletes": "true",
            }
        sort = ""
        if settings.sort_order is not None:
            sort = f", strategy => 'sort', sort_order => {_sql_string(settings.sort_order)}"
        row = _row(
            self.spark,
            f"CALL {self.procedures}.rewrite_data_files(table => {self.argument}{sort}, "
            f"options => {_options(options)})",
        )
        self.record("compact", "ran", "; ".join(reasons) + ": " + _counts(row), started)

    def compact_deletes(self, dry_run: bool) -> None:
        """``rewrite_position_delete_files`` for the delete files compaction left, where it pays: a
        data file that readers open several delete files for (the sink writes one per partition and
        round; the rewrite leaves one per data file), or dangling ones (the rewrite drops rows that
        name files no longer live). ``rewrite-all``, since Iceberg's own selection by file count per
        partition also rewrites delete files that are one per data file already."""
        started = time.monotonic()
        settings = self.settings
        table = self.catalog.load_table(self.identifier)
        deletes = delete_load(table, settings.delete_file_threshold, settings.delete_ratio_threshold)
        found = (
            f"{deletes.delete_files} delete file(s) ({deletes.position_deletes} position deletes), "
            f"{deletes.dangling} dangling, at most {deletes.most_per_data_file} per data file"
        )
        if deletes.most_per_data_file < 2 and deletes.dangling == 0:
            self.record("deletes", "skipped", found, started)
            return
        if dry_run:
            self.record("deletes", "dry-run", found, started)
            return
        self.refresh()
        options = {"rewrite-all": "true", "partial-progress.enabled": "true"}
        row = _row(
            self.spark,
            f"CALL {self.procedures}.rewrite_position_delete_files(table => {self.argument}, "
            f"options => {_options(options)})",
        )
        self.record("deletes", "ran", f"{found}: {_counts(row)}", started)

    def rewrite_manifests(self, dry_run: bool) -> None:
        started = time.monotonic()
        settings = self.settings
        table = self.catalog.load_table(self.identifier)
        count = live_manifests(table)
        if count < settings.rewrite_manifests_min_count:
            self.record(
                "manifests",
                "skipped",
                f"{count} manifest(s), "
                f"below rewrite-manifests-min-count {settings.rewrite_manifests_min_count}",
                started,
            )
            return
        if dry_run:
            self.record("manifests", "dry-run", f"{count} manifests", started)
            return
        self.refresh()
        row = _row(self.spark, f"CALL {self.procedures}.rewrite_manifests(table => {self.argument})")
        self.record("manifests", "ran", _counts(row), started)

    def expire(self, dry_run: bool) -> None:
        started = time.monotonic()
        settings = self.settings
        table = self.catalog.load_table(self.identifier)
        if orphans.gc_disabled(table):
            self.record("expire", "skipped", orphans.GC_DISABLED, started)
            return
        age, keep = max_snapshot_age(table, settings), min_snapshots_to_keep(table, settings)
        older_than_ms = int(time.time() * 1000 - age.total_seconds() * 1000)
        count = expirable_snapshots(table, older_than_ms, keep)
        if count == 0:
            self.record(
                "expire",
                "skipped",
                f"no snapshot older than {_span(age)} beyond the last {keep} "
                f"of {len(table.metadata.snapshots)}",
                started,
            )
            return
        if dry_run:
            self.record("expire", "dry-run", f"{count} snapshot(s) older than {_span(age)}", started)
            return
        # The floor must survive: its snapshots are about to go.
        self.floor_written = table_state.persist_state(self.catalog, self.identifier, self.sink)
        if self.floor_written:
            log.info(
                "maintenance %s: wrote the sink's state as table properties before expiry: %s",
                self.identifier,
                self.floor_written,
            )
        self.refresh()
        older_than = dt.datetime.fromtimestamp(older_than_ms / 1000, tz=dt.UTC)
        row = _row(
            self.spark,
            f"CALL {self.procedures}.expire_snapshots(table => {self.argument}, "
            f"older_than => TIMESTAMP {_sql_string(older_than.strftime('%Y-%m-%d %H:%M:%S.%f+00:00'))}, "
            f"retain_last => {keep})",
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
        # Spark's property commit retries on conflict with the sink (Iceberg Java's PropertiesUpdate).
        self.spark.sql(
            f"ALTER TABLE {self.qualified} SET TBLPROPERTIES "
            f"({_sql_string(table_state.MAINTENANCE_LAST_RUN_MS)} = {_sql_string(str(now_ms))})"
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
                f"and {result.kept_fresh} younger than {_span(self.settings.orphan_older_than)}"
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
        """What the run did to this table, with its figures after; logged."""
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
        log.info(
            "maintenance %s done in %.1fs: data files %d -> %d, delete files %d -> %d, bytes %d -> %d, "
            "snapshots %d -> %d, manifests %d -> %d, orphans %s %d%s",
            self.identifier,
            outcome.duration_s,
            outcome.before.data_files,
            after.data_files,
            outcome.before.delete_files,
            after.delete_files,
            outcome.before.bytes,
            after.bytes,
            outcome.before.snapshots,
            after.snapshots,
            outcome.before.manifests,
            after.manifests,
            "to remove" if dry_run else "removed",
            len(outcome.orphans_removed),
            "" if outcome.ok else " (some steps failed)",
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
                _span(age),
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


def select_tables(catalog: Catalog, sink: str, tables: Sequence[str] | None) -> list[str]:
    """The tables to maintain: the sink's tables, or the named ones (each must be a sink table)."""
    found = [t.identifier for t in table_state.sink_tables(catalog, sink)]
    if tables is None:
        return found
    unknown = [t for t in tables if t not in found]
    if unknown:
        raise TableError(
            f"table(s) {', '.join(unknown)} hold no commit of sink {sink!r}; maintain works on the sink's "
            f"own tables ({', '.join(found) or 'none yet'})\n"
            "  fix: name one of those with --table, or omit --table"
        )
    return list(dict.fromkeys(tables))


def maintain(
    spark: Any,
    config: SinkConfig,
    tables: Sequence[str] | None = None,
    dry_run: bool = False,
    stop: threading.Event | None = None,
) -> list[TableMaintenance]:
    """Maintain the sink's tables (or ``tables``): per table compaction, manifest rewrite and expiry,
    then orphan cleanup of all of them, then the ``last-run-ms`` property where no step failed (so
    ``status`` shows the last complete maintenance). ``dry_run`` decides and reports without changing
    anything (the orphans listed are those that would be removed). Once ``stop`` is set (the app
    is stopping), the remaining steps are skipped."""
    catalog = load_catalog(config.catalog)
    runs = []
    for identifier in select_tables(catalog, config.name, tables):
        run = _TableRun(spark, catalog, config, identifier, stop)
        run.rewrite(dry_run)
        runs.append(run)
    _warn_short_orphan_ages(runs)
    cleanup = _clean_orphans(catalog, config, runs, dry_run, stop)
    results = []
    for run in runs:
        run.record_orphans(cleanup, dry_run)
        run.mark_last_run(dry_run)
        results.append(run.outcome(cleanup, dry_run))
    return results


def render_text(results: Sequence[TableMaintenance]) -> str:
    """The short per-table summary ``fanout-sink maintain`` prints."""
    if not results:
        return "no table holds a commit of this sink yet: nothing to maintain"
    lines = []
    for r in results:
        lines.append(
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
            f"{r.duration_s:.1f}s"
        )
        lines += [f"  {step.name}: {step.action} {step.detail}" for step in r.steps]
    return "\n".join(lines)
