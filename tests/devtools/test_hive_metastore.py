"""Hive's standalone metastore of the stack: PyIceberg's HiveCatalog commits through it (namespace,
table, appends under the metastore's lock), a second start on its work dir is refused, and namespaces,
tables and their commits survive a SIGKILL and a restart."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.hive_metastore import HiveMetastore, HiveMetastoreState
from fanout_sink.errors import StackError


def _settings(state: HiveMetastoreState) -> CatalogSettings:
    return CatalogSettings(name="hms", type="hive", uri=state.uri, warehouse=state.warehouse_location)


def _rows(state: HiveMetastoreState) -> list[int]:
    """The table's rows through a catalog client of its own (nothing cached from the writer)."""
    table = load_catalog(_settings(state)).load_table("kept.events")
    return sorted(table.scan().to_arrow()["id"].to_pylist())


@pytest.mark.usefixtures("own_stores")
def test_hive_metastore_serves_pyiceberg_and_keeps_tables_across_a_kill(tmp_path: Path) -> None:
    server = HiveMetastore(tmp_path / "hive-metastore")
    state = server.start(timeout_s=300)
    try:
        assert state.uri.startswith("thrift://127.0.0.1:")
        catalog = load_catalog(_settings(state))
        catalog.create_namespace("kept")
        table = catalog.create_table("kept.events", schema=pa.schema([("id", pa.int64())]))
        table.append(pa.table({"id": [1, 2]}))
        table.append(pa.table({"id": [3]}))
        assert _rows(state) == [1, 2, 3]
        # The table's files are in the stack's warehouse folder, under the namespace's database folder
        # (Hadoop spells the location ``file:/...``).
        warehouse = Path(state.warehouse_location.removeprefix("file://"))
        assert table.location() == f"file:{warehouse}/kept.db/events"
        assert any((warehouse / "kept.db" / "events" / "data").iterdir())
        with pytest.raises(StackError, match="already running"):
            HiveMetastore(tmp_path / "hive-metastore").start()

        server.kill()
        again = HiveMetastore(tmp_path / "hive-metastore")
        restarted = again.start(timeout_s=300)
        try:
            # Same port: a client configured before the crash keeps working.
            assert restarted.port == state.port
            assert _rows(restarted) == [1, 2, 3]
            load_catalog(_settings(restarted)).load_table("kept.events").append(pa.table({"id": [4]}))
            assert _rows(restarted) == [1, 2, 3, 4]
        finally:
            again.stop()
        assert again.exit_code is not None
    finally:
        server.kill()
