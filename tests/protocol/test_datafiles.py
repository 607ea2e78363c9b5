"""Data files written on the worker side come back intact through the control topic's encoding."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from fanout_sink.protocol import datafiles
from fanout_sink.protocol import events as ev

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "kind", StringType(), required=False),
    NestedField(3, "ts", TimestamptzType(), required=False),
    NestedField(4, "score", DoubleType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="kind"),
    PartitionField(source_id=3, field_id=1001, transform=DayTransform(), name="ts_day"),
)


def _rows() -> pa.Table:
    day = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return pa.Table.from_pylist(
        [
            {"id": i, "kind": ["a", "b", None][i % 3], "ts": day + dt.timedelta(hours=7 * i), "score": i / 2}
            for i in range(20)
        ]
        + [{"id": 99, "kind": "a", "ts": day, "score": float("nan")}],
        schema=SCHEMA.as_arrow(),
    )


def test_partitioned_files_round_trip_through_events_and_append(catalog: Any) -> None:
    catalog.create_namespace("w")
    table = catalog.create_table("w.parts", schema=SCHEMA, partition_spec=SPEC)
    files = datafiles.write_data_files(table, _rows())
    assert len(files) > 3  # one file per (kind, day) partition
    records = [datafiles.to_record(f, table) for f in files]
    wire = ev.encode(
        ev.Event(
            sink="s",
            payload=ev.DataWritten(
                table=ev.TableRef(namespace=("w",), name="parts", uuid=str(table.metadata.table_uuid)),
                files=tuple(records),
                topic="t",
                partition=0,
                next_offset=21,
            ),
        )
    )
    decoded = ev.decode(wire).payload
    assert isinstance(decoded, ev.DataWritten)
    restored = [datafiles.from_record(r, table) for r in decoded.files]
    for original, back in zip(files, restored, strict=True):
        assert back.file_path == original.file_path
        assert back.partition == original.partition
        assert back.lower_bounds == original.lower_bounds
        assert back.nan_value_counts == original.nan_value_counts
        assert back.record_count == original.record_count

    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for data_file in restored:
            append.append_data_file(data_file)
    table = catalog.load_table("w.parts")
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted(_rows()["id"].to_pylist())
    # Partition pruning works from the carried partition values and bounds.
    only_b = table.scan(row_filter="kind == 'b'").to_arrow()
    assert sorted(only_b["id"].to_pylist()) == [i for i in range(20) if i % 3 == 1]


def test_each_call_writes_new_file_names(catalog: Any) -> None:
    catalog.create_namespace("w")
    table = catalog.create_table("w.flat", schema=SCHEMA)
    first = {f.file_path for f in datafiles.write_data_files(table, _rows())}
    second = {f.file_path for f in datafiles.write_data_files(table, _rows())}
    assert first and second and not first & second
    assert datafiles.write_data_files(table, _rows().slice(0, 0)) == []


def test_deleted_keys_round_trip_through_a_key_file_in_the_tables_current_types(catalog: Any) -> None:
    schema = Schema(
        NestedField(1, "tenant", StringType(), required=True),
        NestedField(2, "id", LongType(), required=True),
        NestedField(3, "name", StringType(), required=False),
        identifier_field_ids=[1, 2],
    )
    catalog.create_namespace("db")
    table = catalog.create_table("db.keys", schema=schema)
    keys = pa.table({"tenant": ["a", "b"], "id": pa.array([1, 2], pa.int32()), "name": ["x", "y"]})

    written = datafiles.write_key_file(table, keys.select(["tenant", "id"]))

    assert written.record_count == 2 and written.file_size_in_bytes > 0
    assert written.file_path.startswith(table.location())
    assert not any(written.file_path == f.file_path for f in table.inspect.files().to_pylist())
    read = datafiles.read_key_files(table, ["tenant", "id"], [written, written])
    assert read.schema.field("id").type == pa.int64()
    assert read.to_pylist() == [{"tenant": "a", "id": 1}, {"tenant": "b", "id": 2}] * 2
    assert datafiles.read_key_files(table, ["id"], []).num_rows == 0
