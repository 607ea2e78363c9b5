"""An append table's rows streamed chunk by chunk into open Parquet files (issue 26, item 1): the files
equal what PyIceberg writes for the same rows (metrics, bounds, partition values), roll by the table's
target size per partition, and read back whole and pruned by PyIceberg."""

from __future__ import annotations

import datetime as dt
import errno
import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType
from support.common import record_fsyncs

from fanout_sink.protocol import datafiles, file_layouts
from fanout_sink.protocol.rolling_files import RollingFiles, WrittenTable
from fanout_sink.pyiceberg_internals import arrow_writes

DAY = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "kind", StringType()),
    NestedField(4, "score", DoubleType()),
    identifier_field_ids=[1],
)
SPEC = PartitionSpec(
    PartitionField(source_id=1, field_id=1000, transform=BucketTransform(4), name="id_bucket"),
    PartitionField(source_id=2, field_id=1001, transform=DayTransform(), name="ts_day"),
)


@pytest.fixture(autouse=True)
def _no_layouts_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts are kept per process by schema shape, and these tests share one schema: each starts
    with none, so that what it counts is its own work."""
    monkeypatch.setattr(file_layouts, "LAYOUTS", {})
    monkeypatch.setattr(file_layouts, "SHAPES", {})


def _chunk(first: int, count: int) -> pa.Table:
    """Rows ``first..first+count`` over four id buckets and four days, some nulls and NaNs."""
    return pa.Table.from_pylist(
        [
            {
                "id": i,
                "kind": ["a", "b", None][i % 3],
                "ts": DAY + dt.timedelta(hours=(i * 7) % 96),
                "score": float("nan") if i % 50 == 0 else i / 2,
            }
            for i in range(first, first + count)
        ],
        schema=SCHEMA.as_arrow(),
    )


def _append(table: Table, written: WrittenTable) -> list[DataFile]:
    restored = [datafiles.from_record(r, table) for r in written.records]
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for data_file in restored:
            append.append_data_file(data_file)
    return restored


def _comparable(data_file: DataFile) -> dict[str, Any]:
    """What a data file says about its rows (its path and name differ per write)."""
    return {
        "partition": data_file.partition,
        "spec_id": data_file.spec_id,
        "record_count": data_file.record_count,
        "column_sizes": data_file.column_sizes,
        "value_counts": data_file.value_counts,
        "null_value_counts": data_file.null_value_counts,
        "nan_value_counts": data_file.nan_value_counts,
        "lower_bounds": data_file.lower_bounds,
        "upper_bounds": data_file.upper_bounds,
        "split_offsets": data_file.split_offsets,
        "file_format": data_file.file_format,
    }


@pytest.mark.parametrize("partitioned", [True, False], ids=["partitioned", "unpartitioned"])
def test_one_chunk_writes_the_files_pyiceberg_writes(catalog: Any, partitioned: bool) -> None:
    catalog.create_namespace("w")
    spec = {"partition_spec": SPEC} if partitioned else {}
    table = catalog.create_table("w.same", schema=SCHEMA, **spec)
    rows = _chunk(0, 500)
    expected = datafiles.write_data_files(table, rows)
    rolling = RollingFiles()
    rolling.add("w.same", table, rows)
    [written] = rolling.finish()["w.same"]
    ours = [datafiles.from_record(r, table) for r in written.records]

    def key(f: DataFile) -> str:
        return repr(f.partition)

    assert len(ours) == len(expected) == (16 if partitioned else 1)
    for mine, theirs in zip(sorted(ours, key=key), sorted(expected, key=key), strict=True):
        assert _comparable(mine) == _comparable(theirs)
        assert mine.file_path.rsplit("/", 1)[0] == theirs.file_path.rsplit("/", 1)[0], "same partition folder"
    assert written.rows == rows.num_rows


def test_files_after_the_first_of_a_layout_are_written_alike_with_its_work_done_once(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's statistics plan, column ids and conversion to the file schema are worked out once per
    process, not per file (at 2,000 tables of 25 rows a slice they were ~1.2 ms of each file's ~6 ms);
    the files after the first carry the same field ids and statistics as PyIceberg's."""
    catalog.create_namespace("w")
    table = catalog.create_table("w.again", schema=SCHEMA)
    calls: list[str] = []
    to_file_schema = arrow_writes.to_file_schema
    monkeypatch.setattr(
        arrow_writes, "to_file_schema", lambda *a: calls.append("convert") or to_file_schema(*a)
    )
    written = []
    for first in (0, 1000, 2000):
        rolling = RollingFiles()
        rolling.add("w.again", table, _chunk(first, 300))
        [files] = rolling.finish()["w.again"]
        written.append(files)
    assert calls == ["convert"], "converted by PyIceberg's visitor once, then only named"
    for n, files in enumerate(written):
        [record] = files.records
        ours = datafiles.from_record(record, table)
        [theirs] = datafiles.write_data_files(table, _chunk(n * 1000, 300))
        assert _comparable(ours) == _comparable(theirs)
        ids = [
            f.metadata[b"PARQUET:field_id"] for f in pq.read_schema(ours.file_path.removeprefix("file://"))
        ]
        assert ids == [b"1", b"2", b"3", b"4"]


def test_tables_of_one_schema_share_one_layout_and_a_different_schema_gets_its_own(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dynamic routing makes thousands of tables of one schema: the layout is derived once per schema
    shape, not per table (with a layout per table and a cap of 4,096, a worker serving 5,000 tables
    derived them all again every batch). Each table's files are still PyIceberg's, with its field ids."""
    checked: list[str] = []
    check = arrow_writes.check_schema_compatible
    monkeypatch.setattr(
        arrow_writes, "check_schema_compatible", lambda *a: checked.append("check") or check(*a)
    )
    catalog.create_namespace("w")
    alike = [catalog.create_table(f"w.alike{n}", schema=SCHEMA) for n in range(3)]
    other = catalog.create_table(
        "w.other",
        schema=Schema(*SCHEMA.fields, NestedField(5, "extra", StringType()), identifier_field_ids=[1]),
    )
    derived: list[int] = []
    for table in (*alike, other, *alike):
        rows = _chunk(0, 40)
        if table is other:
            rows = rows.append_column("extra", pa.array(["x"] * 40))
        rolling = RollingFiles()
        rolling.add(table.name()[-1], table, rows)
        [written] = rolling.finish()[table.name()[-1]]
        derived.append(len(checked))
        [ours] = [datafiles.from_record(r, table) for r in written.records]
        [theirs] = datafiles.write_data_files(table, rows)
        checked.clear()
        assert _comparable(ours) == _comparable(theirs)
    assert derived == [1, 0, 0, 1, 0, 0, 0], "one layout for the three alike tables, one for the other"


def test_a_commits_table_state_keeps_the_tables_layout_and_a_write_property_changes_it(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink records its per-round state (commit id, control offsets, VTTS) in table properties:
    a layout keyed on every property got a new key after each commit, so every round derived every
    table's layout again and tables of one schema stopped sharing one (issue 50). Only the write
    properties (``write.*``: Parquet options, metrics modes, row-group limit) decide a layout."""
    checked: list[str] = []
    check = arrow_writes.check_schema_compatible
    monkeypatch.setattr(
        arrow_writes, "check_schema_compatible", lambda *a: checked.append("check") or check(*a)
    )
    catalog.create_namespace("w")
    table = catalog.create_table("w.t", schema=SCHEMA)
    rows = _chunk(0, 10)
    first = file_layouts.layout_for(table, rows.schema, downcast=False)
    with table.transaction() as txn:  # what a round's commit writes beside its snapshot
        txn.set_properties({"fanout-sink.s.commit-id": "r1", "fanout-sink.s.control-offsets": '{"0": 7}'})
    table = catalog.load_table("w.t")
    assert file_layouts.layout_for(table, rows.schema, downcast=False) is first
    assert checked == ["check"], "derived once, not again after the commit"
    with table.transaction() as txn:
        txn.set_properties({"write.parquet.compression-codec": "gzip"})
    table = catalog.load_table("w.t")
    changed = file_layouts.layout_for(table, rows.schema, downcast=False)
    assert changed is not first and changed.writer_options["compression"] == "gzip"


def test_many_chunks_into_a_partitioned_table_roll_files_by_size_with_correct_bounds(catalog: Any) -> None:
    catalog.create_namespace("w")
    table = catalog.create_table("w.parts", schema=SCHEMA, partition_spec=SPEC)
    per_row = _chunk(0, 1000).nbytes // 1000
    rows_per_file = 40
    with table.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": str(per_row * rows_per_file)})
    table = catalog.load_table("w.parts")
    chunks, chunk_rows = 30, 200
    rolling = RollingFiles()
    for n in range(chunks):
        rolling.add("w.parts", table, _chunk(n * chunk_rows, chunk_rows))
    [written] = rolling.finish()["w.parts"]
    restored = _append(table, written)
    table = catalog.load_table("w.parts")

    total = chunks * chunk_rows
    assert written.rows == total
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(total))
    partitions = {repr(f.partition) for f in restored}
    assert len(partitions) == 16, "4 id buckets x 4 days"
    # Each partition gets ~375 rows over the 30 chunks (~12 per chunk): files fill across chunks to
    # ~40 rows each instead of one file per chunk (30 per partition) or one per partition.
    assert len(restored) < chunks * len(partitions) / 2
    for partition in partitions:
        counts = sorted((f.record_count for f in restored if repr(f.partition) == partition), reverse=True)
        assert len(counts) > 1 and all(c == counts[0] for c in counts[:-1]), (partition, counts)
        assert abs(counts[0] - rows_per_file) <= rows_per_file // 5, (partition, counts)
    # Each file's bounds are its rows' own, so a filter on id reads back just the row it names.
    for data_file in restored:
        ids = pq.read_table(data_file.file_path.removeprefix("file://"), columns=["id"])["id"]
        assert from_bytes(LongType(), data_file.lower_bounds[1]) == pc.min(ids).as_py()
        assert from_bytes(LongType(), data_file.upper_bounds[1]) == pc.max(ids).as_py()
        assert data_file.record_count == len(ids)
    for wanted in (0, 1234, total - 1):
        assert table.scan(row_filter=EqualTo("id", wanted)).to_arrow()["id"].to_pylist() == [wanted]
        pruned = list(table.scan(row_filter=EqualTo("id", wanted)).plan_files())
        assert len(pruned) < len(restored) / 4, "partition values and bounds prune the other files"
    only_b = table.scan(row_filter="kind == 'b'").to_arrow()["id"].to_pylist()
    assert sorted(only_b) == [i for i in range(total) if i % 3 == 1]


def test_a_schema_change_between_chunks_closes_the_files_of_the_former_schema(catalog: Any) -> None:
    catalog.create_namespace("w")
    table = catalog.create_table("w.evolve", schema=SCHEMA)
    rolling = RollingFiles()
    rolling.add("w.evolve", table, _chunk(0, 10))
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    table = catalog.load_table("w.evolve")
    later = _chunk(10, 10).append_column("extra", pa.array(["x"] * 10))
    rolling.add("w.evolve", table, later.cast(table.schema().as_arrow()))
    [written] = rolling.finish()["w.evolve"]
    assert len(written.records) == 2, "one file per schema"
    _append(table, written)
    rows = catalog.load_table("w.evolve").scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["extra"]) for r in rows) == [(i, None if i < 10 else "x") for i in range(20)]


def test_a_tables_small_chunks_leave_in_one_row_group_written_once(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink routing to hundreds of tables gives each a few rows per chunk. Written chunk by chunk,
    each file was made of row groups that small (one per chunk: readers pay per row group) and each
    chunk paid the table's conversion and a Parquet write (issue 34). Held until a row group's worth
    (or the end of the slice), they leave as one row group, converted once; a second slice over the
    same table derives its file layout from the cache, not anew."""
    catalog.create_namespace("w")
    table = catalog.create_table("w.small", schema=SCHEMA)
    checks: list[int] = []
    check = arrow_writes.check_schema_compatible
    monkeypatch.setattr(arrow_writes, "check_schema_compatible", lambda *a: checks.append(1) or check(*a))
    for _ in range(2):
        rolling = RollingFiles()
        for n in range(50):
            rolling.add("w.small", table, _chunk(n * 20, 20))
        assert rolling.held_bytes > 0, "nothing written before a row group's worth"
        [written] = rolling.finish()["w.small"]
        (record,) = written.records
        data_file = datafiles.from_record(record, table)
        parquet = pq.ParquetFile(data_file.file_path.removeprefix("file://"))
        assert parquet.metadata.num_row_groups == 1
        assert sorted(parquet.read(columns=["id"])["id"].to_pylist()) == list(range(1000))
        assert data_file.record_count == written.rows == 1000
    assert len(checks) == 1, "one check of the table's schema against the rows', for both slices"


def test_rows_held_over_many_tables_stay_within_the_budget_and_all_land(catalog: Any) -> None:
    """Held rows are bounded for the whole slice write, not per table: over the budget the largest
    tables' rows are written, so 40 tables of held rows cost at most the budget, and every row still
    lands once."""
    catalog.create_namespace("w")
    tables = {f"w.t{n}": catalog.create_table(f"w.t{n}", schema=SCHEMA) for n in range(40)}
    budget = _chunk(0, 100).nbytes * 8
    rolling = RollingFiles(buffer_bytes=budget)
    for chunk in range(10):
        for n, (name, table) in enumerate(tables.items()):
            rolling.add(name, table, _chunk(chunk * 100 + n * 1000 * 1000, 25 + n))
            assert rolling.held_bytes <= budget
            # The running total is what the writers hold (it is kept, not summed per add).
            assert rolling.held_bytes == sum(w.held_bytes for w in rolling._writers.values())
    written = rolling.finish()
    assert rolling.held_bytes == 0
    for n, (name, table) in enumerate(tables.items()):
        [files] = written[name]
        restored = _append(table, files)
        assert sum(f.record_count for f in restored) == files.rows == 10 * (25 + n)
        ids = sorted(catalog.load_table(name).scan().to_arrow()["id"].to_pylist())
        first = n * 1000 * 1000
        assert ids == sorted(first + chunk * 100 + i for chunk in range(10) for i in range(25 + n))


def test_a_slices_files_are_fsynced_together_at_finish_each_file_and_folder_once(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One at a time, each file's fsync and its folder's were ~2 ms of wall time a file, a quarter of
    a slice at 5,000 tables (issue 50): the files a slice write closes, rolled ones too, are fsynced
    at its finish, on a few threads, before any event can name them."""
    catalog.create_namespace("w")
    rolled = catalog.create_table("w.rolled", schema=SCHEMA, partition_spec=SPEC)
    with rolled.transaction() as tx:  # files fill within the slice and are closed before its end
        tx.set_properties({"write.target-file-size-bytes": str(_chunk(0, 1000).nbytes // 100)})
    plain = catalog.create_table("w.plain", schema=SCHEMA)
    tables = {"w.rolled": catalog.load_table("w.rolled"), "w.plain": plain}
    synced = record_fsyncs(monkeypatch)
    rolling = RollingFiles()
    for n in range(5):
        for name, table in tables.items():
            rolling.add(name, table, _chunk(n * 200, 200))
    assert synced == [], "a file closed before the slice's end waits for the others"
    written = rolling.finish()

    paths = [r.file_path.removeprefix("file://") for w in written.values() for t in w for r in t.records]
    assert len(paths) > len(tables) * 16, "files were rolled within the slice"
    assert set(paths) | {os.path.dirname(p) for p in paths} <= set(synced)
    assert os.path.dirname(os.path.dirname(os.path.dirname(paths[0]))) in synced, "a new folder's entry"
    assert len(synced) == len(set(synced)), "each file and folder once"


def test_a_failed_fsync_fails_the_slice_write(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog.create_namespace("w")
    rolling = RollingFiles()
    for n in range(3):
        rolling.add(f"w.t{n}", catalog.create_table(f"w.t{n}", schema=SCHEMA), _chunk(0, 10))

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        rolling.finish()
