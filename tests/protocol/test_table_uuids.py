"""A worker's check that its cached tables were not dropped and recreated, batched for SQL catalogs.

Before every transaction a worker asks whether each table it wrote for is still the one it loaded
(same uuid). Loading every table for that was half of a packed task's time at 5,000 tables (issue
32); ``current_table_uuids`` reads the pointers of many tables in one query and only the uuid of a
moved pointer's metadata file. No broker: a SQLite SQL catalog and the slice writer's check itself.
"""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

from fanout_sink.protocol.slice_writer import SliceWriter
from fanout_sink.pyiceberg_internals import sql_catalog
from fanout_sink.pyiceberg_internals.sql_catalog import current_table_uuids

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def _tables(catalog: Any, count: int) -> dict[str, Table]:
    catalog.create_namespace_if_not_exists("db")
    return {f"db.t{n}": catalog.create_table(f"db.t{n}", schema=SCHEMA) for n in range(count)}


def _append(table: Table) -> None:
    table.append(pa.table({"id": pa.array([1], pa.int64())}))


def test_unmoved_moved_dropped_and_recreated_tables(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_catalog, "NAMES_PER_QUERY", 2)  # three queries for five tables
    tables = _tables(catalog, 5)
    _append(catalog.load_table("db.t1"))  # a commit moves the pointer; same table
    catalog.drop_table("db.t2")
    catalog.drop_table("db.t3")
    recreated = catalog.create_table("db.t3", schema=SCHEMA)

    uuids = current_table_uuids(tables)

    assert uuids == {
        "db.t0": str(tables["db.t0"].metadata.table_uuid),
        "db.t1": str(tables["db.t1"].metadata.table_uuid),
        "db.t2": None,
        "db.t3": str(recreated.metadata.table_uuid),
        "db.t4": str(tables["db.t4"].metadata.table_uuid),
    }
    assert str(recreated.metadata.table_uuid) != str(tables["db.t3"].metadata.table_uuid)


def test_an_unmoved_pointer_reads_no_metadata_file(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _tables(catalog, 2)
    _append(catalog.load_table("db.t1"))
    read: list[str] = []
    real = sql_catalog.metadata_table_uuid

    def counted(io: Any, location: str) -> str:
        read.append(location)
        return real(io, location)

    monkeypatch.setattr(sql_catalog, "metadata_table_uuid", counted)
    current_table_uuids(tables)
    assert read == [catalog.load_table("db.t1").metadata_location]


def test_tables_of_other_catalogs_are_left_to_the_caller(catalog: Any) -> None:
    sql = _tables(catalog, 1)["db.t0"]
    other = Table(
        ("db", "x"), metadata=sql.metadata, metadata_location=sql.metadata_location, io=sql.io,
        catalog=NoopCatalog("noop"),
    )  # fmt: skip
    assert current_table_uuids({"db.t0": sql, "db.x": other}) == {"db.t0": str(sql.metadata.table_uuid)}


@pytest.mark.parametrize("compressed", [False, True])
def test_a_uuid_past_the_head_of_the_file_is_read_from_all_of_it(tmp_path: Path, compressed: bool) -> None:
    table_uuid = uuid.uuid4()
    # Keys in another order than Iceberg's writers use, the uuid well past the head that is searched.
    text = json.dumps({"properties": {f"k{n}": "v" * 50 for n in range(200)}, "table-uuid": str(table_uuid)})
    name = "00001-x.gz.metadata.json" if compressed else "00001-x.metadata.json"
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if compressed else text.encode())
    assert text.index("table-uuid") > sql_catalog.HEAD_BYTES
    assert sql_catalog.metadata_table_uuid(PyArrowFileIO(), f"file://{path}") == str(table_uuid)


def test_the_slice_writer_names_dropped_and_recreated_tables_only(catalog: Any) -> None:
    tables = _tables(catalog, 4)
    _append(catalog.load_table("db.t0"))
    catalog.drop_table("db.t1")
    catalog.drop_table("db.t2")
    recreated = catalog.create_table("db.t2", schema=SCHEMA)

    changed = SliceWriter._changed_tables(tables)

    assert set(changed) == {"db.t1", "db.t2"}
    assert changed["db.t1"] is None
    current = changed["db.t2"]
    assert current is not None and current.metadata.table_uuid == recreated.metadata.table_uuid
