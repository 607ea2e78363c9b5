"""Small pending files written into fewer at a table's commit: what a ``commit-interval`` table's
gathered rows become, so that a cold table gets fewer files, not only fewer snapshots.

A table with an interval of its own (:mod:`~fanout_sink.protocol.table_cadence`) collects the files of
many rounds, each a task's few rows. At its commit, its append files smaller than three quarters of
its ``write.target-file-size-bytes`` (the small-file share maintenance compacts by) are read, a group
of at most :data:`MERGE_READ_BYTES` at a time, and written as new files of the table
(``datafiles.rewrite_data_files``: the table's current schema and spec, rolled at its target size);
the snapshot appends those instead. Nothing else changes: the originals stay named by their pending
events until the table's commit lands, so a crash after the merged files are written leaves them as
orphans and the originals pending (the next attempt merges again); after the commit, the originals
are the orphans, removed by orphan cleanup once no pending event names them.

Change tables' files are left as they are: a change set's data files and deleted keys are resolved
into position deletes in control-topic order, by file and row position, so merging them would have
to resolve first; their snapshots still drop to one per interval, and maintenance folds the rest.
A merge that fails (a file that no longer reads, a column renamed by hand since) appends the
originals instead, with a WARNING: merging saves files, it never holds rows back.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from fanout_sink.errors import TableError
from fanout_sink.faults import fault_point
from fanout_sink.protocol import datafiles
from fanout_sink.protocol.rolling_files import target_file_bytes

log = logging.getLogger(__name__)

SMALL_SHARE = 0.75
"""A file below this share of the target is small (maintenance's compaction rule)."""
MERGE_READ_BYTES = 128 * 1024 * 1024
"""The most Parquet bytes one merge reads at once: the committer holds one group's rows in memory."""


class SmallFileMerge:
    """One table commit's merge, kept across its conflict retries: the same files are not merged
    twice (the merged files stay valid data files of the table whatever committed in between)."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, ...], tuple[list[DataFile], int]] = {}
        self.merged = 0
        """Pending files written into fewer by the latest call."""

    def __call__(self, table: Table, files: list[DataFile]) -> list[DataFile]:
        """``files`` with the small ones written into fewer files of ``table``."""
        key = tuple(f.file_path for f in files)
        if key not in self._done:
            self._done[key] = _merge(table, files)
        found, self.merged = self._done[key]
        return found


def _merge(table: Table, files: list[DataFile]) -> tuple[list[DataFile], int]:
    target = target_file_bytes(table)
    small = [f for f in files if f.file_size_in_bytes < target * SMALL_SHARE]
    if len(small) < 2:
        return files, 0
    kept = [f for f in files if f.file_size_in_bytes >= target * SMALL_SHARE]
    groups: list[list[DataFile]] = [[]]
    limit, held = min(target, MERGE_READ_BYTES), 0
    for data_file in sorted(small, key=lambda f: f.file_size_in_bytes):
        if groups[-1] and held + data_file.file_size_in_bytes > limit:
            groups.append([])
            held = 0
        groups[-1].append(data_file)
        held += data_file.file_size_in_bytes
    merged = 0
    identifier = ".".join(table.name())
    for group in groups:
        if len(group) < 2:
            kept += group
            continue
        try:
            kept += datafiles.rewrite_data_files(table, [f.file_path for f in group])
        except (TableError, OSError, pa.ArrowException) as exc:
            log.warning(
                "table %s: merging %d small files failed (%s); they are appended as they are",
                identifier,
                len(group),
                exc,
                extra={"table": identifier},
            )
            kept += group
            continue
        merged += len(group)
    if merged:
        fault_point("coordinator.after-merge", table=identifier)
    return kept, merged
