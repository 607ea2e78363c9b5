"""The sink's manifests are PyIceberg's, byte for byte, with their Avro layout built once per layout.

PyIceberg resolves a manifest's Avro writer and renders its header schema for every manifest it
writes, and resolves a reader for every manifest list it reads (~1.1 ms of a ~12 ms table commit,
issue 32); ``pyiceberg_internals.manifests`` keeps them per format version and partition type, and per file
schema. No broker: manifests written side by side, and appends through ``RowDelta`` on a SQL catalog.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro import file as avro_file
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    read_manifest_list,
    write_manifest,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from fanout_sink.protocol import datafiles
from fanout_sink.pyiceberg_internals import manifests, snapshots

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "ts", TimestamptzType(), required=False),
)
PARTITIONED = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"),
    PartitionField(source_id=3, field_id=1001, transform=DayTransform(), name="ts_day"),
)


def _entries(spec: PartitionSpec, count: int) -> list[ManifestEntry]:
    partition = Record("eu", 20_000) if spec.fields else Record()
    return [
        ManifestEntry.from_args(
            status=ManifestEntryStatus.ADDED,
            snapshot_id=7,
            data_file=DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f"file:///warehouse/t/data/{n}.parquet",
                file_format=FileFormat.PARQUET,
                partition=partition,
                record_count=10 + n,
                file_size_in_bytes=1_000 + n,
                column_sizes={1: 80, 2: 40},
                value_counts={1: 10 + n, 2: 10 + n},
                null_value_counts={1: 0, 2: 1},
                lower_bounds={1: (n).to_bytes(8, "little")},
                upper_bounds={1: (n + 9).to_bytes(8, "little")},
                _table_format_version=2,
            ),
        )
        for n in range(count)
    ]


def _write(
    make: Callable[..., Any], path: Path, version: int, spec: PartitionSpec, entries: list[ManifestEntry]
) -> bytes:
    output = PyArrowFileIO().new_output(str(path))
    with make(version, spec, SCHEMA, output, 7, "deflate") as writer:
        for entry in entries:
            writer.add(entry)
    return path.read_bytes()


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "spec", [UNPARTITIONED_PARTITION_SPEC, PARTITIONED], ids=["unpartitioned", "partitioned"]
)
def test_a_manifest_is_byte_for_byte_pyicebergs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int, spec: PartitionSpec
) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"s" * n)  # the one random part: the sync marker
    entries = _entries(spec, 3)
    theirs = _write(write_manifest, tmp_path / "theirs.avro", version, spec, entries)
    for attempt in range(2):  # the second with the layout built by the first
        ours = _write(manifests.manifest_writer, tmp_path / f"ours-{attempt}.avro", version, spec, entries)
        assert ours == theirs


def test_a_tables_second_commit_resolves_no_manifest_writer_or_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = SqlCatalog(
        "layouts", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}"
    )
    catalog.create_namespace("ns")
    catalog.create_table("ns.t", schema=SCHEMA, partition_spec=PARTITIONED)
    resolved: list[str] = []

    def counting(module: Any) -> None:
        own = module.resolve_writer

        def resolve(record_schema: Schema, file_schema: Schema) -> Any:
            resolved.append(module.__name__)
            return own(record_schema=record_schema, file_schema=file_schema)

        monkeypatch.setattr(module, "resolve_writer", resolve)

    counting(avro_file)  # PyIceberg's Avro files: the manifest list's (and, before, each manifest's)
    counting(manifests)
    own_reader = avro_file.resolve_reader

    def resolve_reader(*args: Any, **kwargs: Any) -> Any:
        resolved.append("reader")
        return own_reader(*args, **kwargs)

    monkeypatch.setattr(avro_file, "resolve_reader", resolve_reader)  # the parent's manifest list, before

    def append(n: int) -> None:
        loaded = catalog.load_table("ns.t")
        rows = pa.table(
            {"id": [n], "region": ["eu"], "ts": pa.array([n * 1_000_000], pa.timestamp("us", tz="UTC"))},
            schema=SCHEMA.as_arrow(),
        )
        files = datafiles.write_data_files(loaded, rows)
        txn = loaded.transaction()
        with snapshots.RowDelta(txn, loaded.io, {}) as delta:
            for data_file in files:
                delta.append_data_file(data_file)
        txn.commit_transaction()

    append(1)
    resolved.clear()
    append(2)
    assert resolved == [avro_file.__name__], "per commit, only the new manifest list's writer is resolved"

    loaded = catalog.load_table("ns.t")
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [1, 2]
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    listed = loaded.io.new_input(snapshot.manifest_list)
    listed_manifests = list(read_manifest_list(listed))
    assert [m.added_files_count for m in listed_manifests] == [1, 1]
    for _ in range(2):  # the second with the reader resolved by the first
        assert manifests.read_manifest_list(listed) == listed_manifests
