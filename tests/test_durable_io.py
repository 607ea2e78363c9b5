"""Files the sink writes on a local warehouse are fsynced before anything references them.

Real: the SQLite catalog as the sink loads it, a worker's data-file write, a coordinator-style append
commit (manifest, manifest list, metadata.json). Simulated: durability itself cannot be observed
without pulling the power, so ``os.fsync`` is wrapped to record which paths were synced (it still
syncs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.common import ARROW_SCHEMA, TABLE_SCHEMA, record_fsyncs

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.protocol import datafiles
from fanout_sink.pyiceberg_internals.fileio import DurableFileIO


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return record_fsyncs(monkeypatch)


def test_data_manifest_and_metadata_files_are_fsynced_with_their_directories(
    catalog_settings: CatalogSettings, synced: list[str]
) -> None:
    catalog = load_catalog(catalog_settings)
    catalog.create_namespace("sink")
    table = catalog.create_table("sink.a", schema=TABLE_SCHEMA)
    assert isinstance(table.io, DurableFileIO)
    assert table.metadata_location.removeprefix("file://") in synced  # the first metadata.json

    synced.clear()
    files = datafiles.write_data_files(table, pa.Table.from_pylist([{"id": 1, "topic": "t"}], ARROW_SCHEMA))
    [data_path] = [f.file_path.removeprefix("file://") for f in files]
    assert data_path in synced, "the worker's data file is on disk before its DataWritten event"
    data_dir = os.path.dirname(data_path)
    assert data_dir in synced and os.path.dirname(data_dir) in synced, "the new data/ directory's entry"

    synced.clear()
    with table.transaction() as txn, txn.update_snapshot().fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    table = catalog.load_table("sink.a")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    manifests = [m.manifest_path.removeprefix("file://") for m in snapshot.manifests(table.io)]
    expected = [*manifests, snapshot.manifest_list.removeprefix("file://")]
    expected.append(table.metadata_location.removeprefix("file://"))
    assert [p for p in expected if p not in synced] == []
    assert os.path.dirname(expected[-1]) in synced


def test_a_chosen_file_io_and_remote_warehouses_are_left_alone(tmp_path: Path) -> None:
    chosen = CatalogSettings(
        name="c",
        uri=f"sqlite:///{tmp_path / 'c.db'}",
        warehouse=f"file://{tmp_path / 'wh'}",
        **{"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"},
    )
    catalog: Any = load_catalog(chosen)
    catalog.create_namespace("sink")
    table = catalog.create_table("sink.a", schema=TABLE_SCHEMA)
    assert type(table.io).__name__ == "PyArrowFileIO"
    remote = CatalogSettings(name="r", uri=f"sqlite:///{tmp_path / 'r.db'}", warehouse="s3://bucket/wh")
    assert "py-io-impl" not in load_catalog(remote).properties
