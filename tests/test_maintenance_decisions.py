"""Maintenance decisions over a table's metadata, without Spark
(``fanout_sink/maintenance/decisions.py``): which files compaction would take, and how position
deletes weigh on data files as Iceberg's ``rewrite_data_files`` selects them. The runs that carry
them out are in ``tests/spark/test_maintenance.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from support.common import ARROW_SCHEMA, TABLE_SCHEMA, create_tables
from support.row_deltas import commit_round

from fanout_sink.maintenance import decisions
from fanout_sink.protocol import datafiles, row_delta


def test_compaction_pays_only_for_enough_small_files_in_one_partition(catalog: Any) -> None:
    catalog.create_namespace_if_not_exists("sink")
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="topic")
    )
    table = catalog.create_table("sink.parts", schema=TABLE_SCHEMA, partition_spec=spec)
    for i, topic in enumerate(["a", "a", "b", "a", "b"]):
        table.append(pa.Table.from_pylist([{"id": i, "topic": topic}], ARROW_SCHEMA))
    table = catalog.load_table("sink.parts")
    assert decisions.compaction_candidates(table, target=1 << 20, min_input_files=3) == 3  # a: 3, b: 2
    assert decisions.compaction_candidates(table, target=100, min_input_files=3) == 0  # none is small


def test_delete_load_counts_the_sinks_deletes_as_rewrite_data_files_selects_them(catalog: Any) -> None:
    """The coordinator's deletes, without Spark: a round that hits one data file writes a file-scoped
    delete file (the ratio applies), a round over two files one partition-scoped file (each data file
    then reads one more delete file; the ratio ignores it, as Iceberg's does). Rounds after the first
    two only delete, so that no new data file falls inside a partition-scoped file's path bounds."""
    create_tables(catalog, ["keyed"])
    table = catalog.load_table("sink.keyed")

    def change(ids: range = range(0), deleted: Sequence[int] = ()) -> row_delta.ChangeSet:
        rows = pa.Table.from_pylist([{"id": i, "topic": "new"} for i in ids], ARROW_SCHEMA)
        files = datafiles.write_data_files(table, rows) if ids else []
        return row_delta.ChangeSet(files, pa.table({"id": pa.array(deleted, pa.int64())}))

    commit_round(table, ["id"], [change(range(100))])  # data file 1: ids 0-99
    commit_round(table, ["id"], [change(range(100, 110))])  # data file 2: ids 100-109
    assert decisions.delete_load(table.refresh(), 1, 0.3) == decisions.NO_DELETES
    commit_round(table.refresh(), ["id"], [change(deleted=range(40))])  # 40 of file 1's rows: file-scoped
    load = decisions.delete_load(table.refresh(), 2, 0.4)
    assert (load.delete_files, load.position_deletes, load.data_files_with_deletes) == (1, 40, 1)
    assert (load.over_threshold, load.dangling, load.most_per_data_file) == (1, 0, 1)  # 40% >= 0.4
    assert decisions.delete_load(table, 2, 0.5).over_threshold == 0
    assert decisions.delete_load(table, 1, 1.0).over_threshold == 1  # one delete file >= 1

    commit_round(table.refresh(), ["id"], [change(deleted=[45, 105])])  # files 1 and 2: partition-scoped
    load = decisions.delete_load(table.refresh(), 2, 0.5)
    assert (load.delete_files, load.position_deletes, load.data_files_with_deletes) == (2, 42, 2)
    assert (load.most_per_data_file, load.over_threshold) == (2, 1)  # file 1: two delete files
    assert decisions.delete_load(table, 3, 0.4).over_threshold == 1  # file 1: 40 file-scoped of 100
    assert decisions.delete_load(table, 3, 0.41).over_threshold == 0  # the 41st is partition-scoped
