"""Compaction of a small table in this process, with pyarrow and PyIceberg, instead of a Spark job.

A day of the sink's commits leaves most tables of a wide fan-out with a few hundred small files and
a few megabytes. Iceberg's ``rewrite_data_files`` costs such a table a Spark job and its planning
(1-2 s of a loaded 2-core machine), far more than reading and writing its rows. Here the same files
are chosen (per partition, those below 75% of the target, where a partition holds at least
``min-input-files`` of them), their rows read with PyIceberg's Arrow reader and written as
PyIceberg's append writes them, and one ``replace`` snapshot swaps them
(:func:`fanout_sink.pyiceberg_internals.rewrites.commit_replace`): the rows, the partitions and the
operation are what the Spark procedure commits.

Only where that holds (:func:`refusal`): no position deletes to fold (a change table's rewrite
applies them: Spark), no sort order, every file under the current partition spec, format v1 or v2,
and at most :data:`MAX_BYTES` of data. The commit requires the snapshot the files were planned at;
when the sink committed meanwhile, the new files are deleted and the table planned again.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table

from fanout_sink.maintenance import decisions
from fanout_sink.pyiceberg_internals.arrow_writes import dataframe_to_data_files
from fanout_sink.pyiceberg_internals.rewrites import commit_replace

MAX_BYTES = 64 * 1024 * 1024
"""The most data a table may hold to be compacted here: read whole into memory, its rows rewritten
in well under a second."""
ATTEMPTS = 3
"""Plans and commits tried when the sink commits the table meanwhile."""


@dataclass(frozen=True)
class Compacted:
    """What one in-process compaction did, in the counts ``rewrite_data_files`` reports."""

    rewritten_data_files_count: int
    added_data_files_count: int
    rewritten_bytes_count: int


def refusal(table: Table, sort_order: str | None) -> str | None:
    """Why the table's compaction must run in Spark; None when it can run here."""
    figures = decisions.figures(table)
    if sort_order is not None:
        return "a sort-order is set"
    if table.format_version > 2:
        return f"format v{table.format_version}"
    if figures.delete_files:
        return f"{figures.delete_files} delete file(s) to fold"
    if figures.bytes > MAX_BYTES:
        return f"{figures.bytes} bytes, over {MAX_BYTES}"
    return None


def _groups(table: Table, target: int, min_input_files: int) -> list[list[FileScanTask]] | None:
    """The small files of each partition that holds at least ``min_input_files`` of them; None when
    some file is under an older partition spec (Spark rewrites those)."""
    spec_id = table.spec().spec_id
    by_partition: dict[object, list[FileScanTask]] = defaultdict(list)
    for task in table.scan().plan_files():
        if task.file.spec_id != spec_id:
            return None
        if task.file.file_size_in_bytes < target * decisions.SMALL_FILE_RATIO:
            by_partition[task.file.partition].append(task)
    return [tasks for tasks in by_partition.values() if len(tasks) >= min_input_files]


def _attempt(table: Table, target: int, min_input_files: int) -> Compacted | None:
    groups = _groups(table, target, min_input_files)
    if groups is None:
        return None
    if not groups:  # another maintainer compacted them meanwhile
        return Compacted(0, 0, 0)
    # PyIceberg's writer bin-packs to the table's target size: the target decided is the one written.
    properties = {**table.metadata.properties, "write.target-file-size-bytes": str(target)}
    metadata = table.metadata.model_copy(update={"properties": properties})
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    removed = [task.file for tasks in groups for task in tasks]
    added = []
    write_uuid = uuid.uuid4()
    for tasks in groups:
        added += dataframe_to_data_files(metadata, scan.to_table(tasks), table.io, write_uuid)
    try:
        commit_replace(table, removed, added)
    except CommitFailedException:
        for data_file in added:
            table.io.delete(data_file.file_path)
        raise
    return Compacted(len(removed), len(added), sum(f.file_size_in_bytes for f in removed))


def compact(load: Callable[[], Table], target: int, min_input_files: int) -> Compacted | None:
    """Rewrite the small files of the table ``load`` returns; None when a file under an older
    partition spec makes it Spark's. A commit the sink wins is planned again on a reloaded table,
    :data:`ATTEMPTS` times in all."""
    for _ in range(ATTEMPTS - 1):
        try:
            return _attempt(load(), target, min_input_files)
        except CommitFailedException:
            continue
    return _attempt(load(), target, min_input_files)
