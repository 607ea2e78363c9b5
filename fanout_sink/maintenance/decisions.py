"""What table maintenance should do to one table, decided from its PyIceberg metadata alone: no
Spark, and no data read (the Spark procedures that carry the decisions out are in
``spark/maintenance.py``). Each step runs only where it pays:

- compaction (Iceberg's ``rewrite_data_files``, bin-pack or sorted by ``sort-order``) when some
  partition holds at least ``min-input-files`` files below 75% of the target size (Iceberg's own
  ``min-file-size-bytes`` default, so the procedure picks the same files), or when some data file
  carries position deletes at or over ``delete-file-threshold`` / ``delete-ratio-threshold``: the
  rewrite folds them into the data (merge-on-read change tables) and drops the deletes left dangling;
- ``rewrite_position_delete_files`` when delete files remain that compaction did not fold and some
  data file has several of them, or some are dangling (they name no live data file);
- ``rewrite_manifests`` when the current snapshot has at least ``rewrite-manifests-min-count`` manifests;
- ``expire_snapshots`` when snapshots older than the age exist beyond the kept count, unless the
  table's garbage collection is off.

Each decision says why in words the run records and ``fanout-sink maintain`` prints.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import Table

from fanout_sink.config.maintenance import MaintenanceSettings
from fanout_sink.protocol import orphans
from fanout_sink.protocol.position_deletes import FILE_PATH_ID

ICEBERG_TARGET_FILE_SIZE = 512 * 1024 * 1024
"""Iceberg's ``write.target-file-size-bytes`` default."""
ICEBERG_MAX_SNAPSHOT_AGE = timedelta(days=5)
"""Iceberg's ``history.expire.max-snapshot-age-ms`` default."""
SMALL_FILE_RATIO = 0.75
"""Below this share of the target a file is worth rewriting (Iceberg's ``min-file-size-bytes`` default)."""


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
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    total = snapshot.summary.get("total-data-files") if snapshot.summary is not None else None
    live = int(total) if total is not None else min_input_files
    if live < min_input_files:
        return live  # the summary's total says so without reading a manifest
    # Counted from the manifests' entries: PyIceberg's `inspect.data_files` converts every file's
    # metrics into an Arrow table first, most of a small table's decision time.
    counts: Counter[tuple[int, object]] = Counter()
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.file_size_in_bytes < int(target * SMALL_FILE_RATIO):
                counts[(entry.data_file.spec_id, entry.data_file.partition)] += 1
    if sum(counts.values()) < min_input_files:
        return sum(counts.values())
    return max(counts.values())


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
    if snapshot.summary is not None and snapshot.summary.get("total-delete-files") == "0":
        return NO_DELETES  # the summary's total says so without reading a manifest
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
    return len(expirable_snapshot_ids(table, older_than_ms, keep))


def expirable_snapshot_ids(table: Table, older_than_ms: int, keep: int) -> list[int]:
    """The snapshots ``expire_snapshots(older_than, retain_last=keep)`` would remove: older than
    ``older_than_ms``, not the last ``keep`` of the current ancestry, not the head of a branch or tag."""
    metadata = table.metadata
    kept = {ref.snapshot_id for ref in metadata.refs.values()}
    ancestor_id: int | None = metadata.current_snapshot_id
    for _ in range(keep):
        if ancestor_id is None:
            break
        kept.add(ancestor_id)
        ancestor = metadata.snapshot_by_id(ancestor_id)
        ancestor_id = ancestor.parent_snapshot_id if ancestor is not None else None
    return [
        s.snapshot_id
        for s in metadata.snapshots
        if s.timestamp_ms < older_than_ms and s.snapshot_id not in kept
    ]


def span(duration: timedelta) -> str:
    """``3d``, ``1h``, ``90s``: a duration as the YAML writes it."""
    seconds = duration.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Decision:
    """One step's verdict over a table's metadata."""

    due: bool
    """The step pays: the procedure is to run (in a dry run, reported only)."""
    detail: str
    """When due, what makes it pay; otherwise why it is skipped."""
    options: dict[str, str] = field(default_factory=dict)
    """The procedure's ``options`` the metadata decided (compaction's target and thresholds)."""


@dataclass(frozen=True)
class Expiry(Decision):
    """The expiry's verdict, with the arguments of ``expire_snapshots`` it was decided for."""

    older_than_ms: int = 0
    keep: int = 0


def compaction(table: Table, settings: MaintenanceSettings) -> Decision:
    """``rewrite_data_files`` pays for enough small files in one partition, or for data files whose
    position deletes reach a threshold; its options select the same files."""
    target = target_file_size(table, settings)
    found = compaction_candidates(table, target, settings.min_input_files)
    deletes = delete_load(table, settings.delete_file_threshold, settings.delete_ratio_threshold)
    thresholds = (
        f"delete-file-threshold {settings.delete_file_threshold} "
        f"or delete-ratio-threshold {settings.delete_ratio_threshold:g}"
    )
    if found < settings.min_input_files and deletes.over_threshold == 0:
        return Decision(
            False,
            f"at most {found} small file(s) in a partition, "
            f"below min-input-files {settings.min_input_files}"
            + (
                f"; {deletes.data_files_with_deletes} data file(s) with deletes, none at {thresholds}"
                if deletes.delete_files
                else ""
            ),
        )
    reasons = []
    if found >= settings.min_input_files:
        reasons.append(f"{found} small files in one partition (target {target} bytes)")
    if deletes.over_threshold:
        reasons.append(f"{deletes.over_threshold} data file(s) with deletes at {thresholds}")
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
    return Decision(True, "; ".join(reasons), options)


def delete_rewrite(table: Table, settings: MaintenanceSettings) -> Decision:
    """``rewrite_position_delete_files`` for the delete files compaction left, where it pays: a data
    file that readers open several delete files for (the sink writes one per partition and round; the
    rewrite leaves one per data file), or dangling ones (the rewrite drops rows that name files no
    longer live)."""
    deletes = delete_load(table, settings.delete_file_threshold, settings.delete_ratio_threshold)
    found = (
        f"{deletes.delete_files} delete file(s) ({deletes.position_deletes} position deletes), "
        f"{deletes.dangling} dangling, at most {deletes.most_per_data_file} per data file"
    )
    return Decision(deletes.most_per_data_file >= 2 or deletes.dangling > 0, found)


def manifest_rewrite(table: Table, settings: MaintenanceSettings) -> Decision:
    """``rewrite_manifests`` once the current snapshot lists ``rewrite-manifests-min-count`` live
    manifests."""
    count = live_manifests(table)
    if count < settings.rewrite_manifests_min_count:
        return Decision(
            False,
            f"{count} manifest(s), below rewrite-manifests-min-count {settings.rewrite_manifests_min_count}",
        )
    return Decision(True, f"{count} manifests")


def expiry(table: Table, settings: MaintenanceSettings) -> Expiry:
    """``expire_snapshots`` when snapshots older than the table's age exist beyond the last ones
    kept, unless its garbage collection is off (``gc.enabled=false``)."""
    if orphans.gc_disabled(table):
        return Expiry(False, orphans.GC_DISABLED)
    age, keep = max_snapshot_age(table, settings), min_snapshots_to_keep(table, settings)
    older_than_ms = int(time.time() * 1000 - age.total_seconds() * 1000)
    count = expirable_snapshots(table, older_than_ms, keep)
    if count == 0:
        detail = (
            f"no snapshot older than {span(age)} beyond the last {keep} of {len(table.metadata.snapshots)}"
        )
        return Expiry(False, detail, older_than_ms=older_than_ms, keep=keep)
    return Expiry(True, f"{count} snapshot(s) older than {span(age)}", older_than_ms=older_than_ms, keep=keep)
