"""A worker's cached tables when their entries expire: checked together, reloaded only when changed.

A worker loads the tables it serves in its first batch, so their cache entries expire together;
loading each again cost ~1-3 ms a table (~5 % of a worker's core at 5,000 tables, issue 50). For a
SQL catalog the expired entries are checked by their metadata pointers in one query; a table is read
again only if its pointer moved, and replaced only if what its writers use changed. Tables recreated
or whose schema evolved meanwhile must still be seen. No broker: a SQLite catalog and the cache.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from sqlalchemy import event

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol import table_state
from fanout_sink.pyiceberg_internals import sql_catalog
from fanout_sink.transform import tables as tables_module
from fanout_sink.transform.tables import TableManager

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
AGE_S = 300.0


class _Clock:
    """The ``time`` module as the cache sees it, ``monotonic`` moved on by :meth:`advance`."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    shifted = _Clock()
    monkeypatch.setattr(tables_module, "time", shifted)
    return shifted


def _config(catalog_settings: CatalogSettings) -> SinkConfig:
    return parse_config(
        {
            "name": "shop",
            "source": {"topics": ["orders"]},
            "catalog": catalog_settings.model_dump(),
            "dynamic": {"table": "join('.', ['db', t])", "applies-to": "all"},
        },
        "test",
        base_dir=Path("."),
    )


class _Counted:
    """Counts the catalog's ``load_table`` calls and its queries of the tables' rows."""

    def __init__(self, catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads: list[str] = []
        self.queries = 0
        load = catalog.load_table

        def load_table(identifier: Any) -> Any:
            self.loads.append(str(identifier))
            return load(identifier)

        def statement(_conn: Any, _cursor: Any, text: str, *_: Any) -> None:
            if text.lstrip().startswith("SELECT") and "FROM iceberg_tables" in text:
                self.queries += 1

        monkeypatch.setattr(catalog, "load_table", load_table)
        event.listen(catalog.engine, "before_cursor_execute", statement)


def _cached_manager(catalog: Any, config: SinkConfig, names: list[str]) -> TableManager:
    catalog.create_namespace_if_not_exists("db")
    for name in names:
        catalog.create_table(name, schema=SCHEMA)
    manager = TableManager(catalog, config, max_age_seconds=AGE_S)
    settings = manager.settings_for(names[0])
    for name in names:
        manager.ensure(name, settings)
    return manager


def test_expired_tables_are_checked_at_once_and_only_a_changed_one_is_reloaded(
    catalog_settings: CatalogSettings, catalog: Any, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(catalog_settings)
    names = [f"db.t{n}" for n in range(8)]
    manager = _cached_manager(catalog, config, names)
    before = {name: manager.cached(name) for name in names}
    other = SqlCatalog(catalog.name, **catalog.properties)  # another process: the coordinator, a user
    appended = other.load_table("db.t1")  # a commit of the sink's kind: a snapshot and its state
    with appended.transaction() as txn:
        txn.append(pa.table({"id": pa.array([1], pa.int64())}))
        txn.set_properties({"fanout-sink.shop.commit-id": "c1"})
    with other.load_table("db.t2").update_schema() as update:  # another worker's schema change
        update.add_column("note", StringType())
    other.drop_table("db.t3")
    recreated = other.create_table("db.t3", schema=SCHEMA)
    other.drop_table("db.t4")
    with other.load_table("db.t5").transaction() as txn:  # a writer's property: its files change
        txn.set_properties({"write.parquet.compression-codec": "gzip"})
    counted = _Counted(catalog, monkeypatch)
    clock.advance(AGE_S + 1)

    settings = manager.settings_for("db.t0")
    after = {name: manager.ensure(name, settings) for name in names if name != "db.t4"}

    assert counted.loads == [] and counted.queries == 1
    for unchanged in ("db.t0", "db.t1", "db.t6", "db.t7"):
        assert after[unchanged] is before[unchanged], unchanged
    assert after["db.t2"].schema().column_names == ["id", "note"]
    assert after["db.t3"].metadata.table_uuid == recreated.metadata.table_uuid
    assert manager.cached("db.t4") is None  # dropped: forgotten, ensure would load (or create) it
    assert after["db.t5"].properties["write.parquet.compression-codec"] == "gzip"
    clock.advance(AGE_S / 2)  # checked entries are fresh again: nothing asked until they expire
    assert all(manager.cached(name) is table for name, table in after.items())
    assert counted.loads == [] and counted.queries == 1


def test_the_sinks_state_properties_are_no_writers_business() -> None:
    """The batched check ignores the properties the sink records its state in at every commit; the
    prefix it ignores is the one ``table_state`` writes (the module below ``protocol/`` keeps a copy)."""
    assert f"{table_state.PREFIX}." == sql_catalog.SINK_PROPERTIES
    assert table_state.key("shop", "commit-id").startswith(sql_catalog.SINK_PROPERTIES)


def test_a_catalog_that_cannot_check_at_once_loads_each_expired_table(
    catalog_settings: CatalogSettings, catalog: Any, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(catalog_settings)
    manager = _cached_manager(catalog, config, ["db.a", "db.b"])
    counted = _Counted(catalog, monkeypatch)
    monkeypatch.setattr(sql_catalog, "is_sql_catalog", lambda catalog: False)  # as for a REST catalog
    checks: list[int] = []  # none: each access would scan every expired entry for nothing
    monkeypatch.setattr(sql_catalog, "tables_for_writing", lambda tables: checks.append(len(tables)) or {})
    clock.advance(AGE_S + 1)
    settings = manager.settings_for("db.a")
    manager.ensure("db.a", settings)
    manager.ensure("db.b", settings)
    assert counted.loads == ["db.a", "db.b"] and counted.queries == 2  # each load's own query
    assert checks == []
