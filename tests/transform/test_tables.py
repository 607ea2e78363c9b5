"""Tables: auto-create from a schema file or the first rows, partition specs, evolution, races."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import DoubleType, LongType, StringType, TimestamptzType

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import TableError
from fanout_sink.pyiceberg_internals import sql_catalog
from fanout_sink.transform.tables import TableManager

REPO = Path(__file__).resolve().parents[2]


def _config(catalog_settings: CatalogSettings, tables: dict[str, Any]) -> SinkConfig:
    return parse_config(
        {
            "name": "shop",
            "source": {"topics": ["orders"]},
            "catalog": catalog_settings.model_dump(),
            "tables": tables,
        },
        "test",
        base_dir=REPO,
    )


def test_create_from_avro_schema_file_with_every_transform(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    partition_by = ["identity(region)", "bucket[8](id)", "truncate[3](customer)", "day(ts)"]
    config = _config(
        catalog_settings,
        {
            "analytics.orders": {
                "schema": "schemas/tables/orders.avsc",
                "partition-by": partition_by,
                "properties": {"write.parquet.compression-codec": "zstd", "owner": "team"},
            }
        },
    )
    manager = TableManager(catalog, config)
    table = manager.ensure("analytics.orders", config.tables["analytics.orders"])
    schema = table.schema()
    assert schema.find_field("id").required and schema.find_field("ts").required
    assert not schema.find_field("customer").required
    assert schema.find_field("ts").field_type == TimestamptzType()
    assert schema.find_field("items.element.qty").required
    transforms = [str(f.transform) for f in table.spec().fields]
    assert transforms == ["identity", "bucket[8]", "truncate[3]", "day"]
    assert table.properties["owner"] == "team"
    assert catalog.load_table("analytics.orders").metadata.table_uuid == table.metadata.table_uuid
    assert manager.ensure("analytics.orders", config.tables["analytics.orders"]) is table  # cached


@pytest.mark.parametrize("transform", ["year(ts)", "month(ts)", "hour(ts)"])
def test_time_transforms_on_inferred_timestamp(
    catalog_settings: CatalogSettings, catalog: Any, transform: str
) -> None:
    config = _config(catalog_settings, {"raw.events": {"partition-by": [transform]}})
    rows = pa.table({"id": [1, 2], "ts": ["2024-05-01T10:00:00Z", "2024-05-02 11:00:00"], "n": [None, None]})
    table = TableManager(catalog, config).ensure("raw.events", config.tables["raw.events"], sample=rows)
    schema = table.schema()
    assert schema.find_field("ts").field_type == TimestamptzType()  # used by a time transform
    assert schema.find_field("id").field_type == LongType()
    assert schema.find_field("n").field_type == StringType()  # all-null column: string
    assert not any(f.required for f in schema.fields)
    assert str(table.spec().fields[0].transform) == transform.split("(")[0]


def test_no_auto_create(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(catalog_settings, {"a.b": {"auto-create": False}})
    with pytest.raises(TableError, match="auto-create is off"):
        TableManager(catalog, config).ensure("a.b", config.tables["a.b"], sample=pa.table({"x": [1]}))


def test_evolution_adds_widens_and_relaxes(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(catalog_settings, {"a.t": {"evolution": True}})
    settings = config.tables["a.t"]
    manager = TableManager(catalog, config)
    first = pa.table(
        {
            "id": pa.array([1], pa.int32()),
            "score": pa.array([1.5], pa.float32()),
            "customer": pa.array([{"id": "c1"}]),
        }
    )
    table = manager.ensure("a.t", settings, sample=first)
    # a required column, to relax later
    with table.update_schema(allow_incompatible_changes=True) as update:
        update.add_column("must", StringType(), required=True)
    table = catalog.load_table("a.t")
    second = pa.table(
        {
            "id": pa.array([2**40], pa.int64()),
            "score": pa.array([0.1], pa.float64()),
            "customer": pa.array([{"id": "c2", "tier": "gold"}]),
            "extra": ["x"],
        }
    )
    evolved = manager.evolve("a.t", table, second, settings)
    schema = evolved.schema()
    assert schema.find_field("id").field_type == LongType()
    assert schema.find_field("score").field_type == DoubleType()
    assert schema.find_field("customer.tier").field_type == StringType()
    assert schema.find_field("extra").field_type == StringType()
    assert not schema.find_field("must").required
    # Nothing left to change: no new schema version.
    assert manager.evolve("a.t", evolved, second, settings).schema().schema_id == schema.schema_id


def test_evolution_adds_nested_fields_whose_names_read_like_arrow_paths(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """A JSON key is any text: "." or "[0]" inside a struct is a field name, not a path into it."""
    config = _config(catalog_settings, {"a.t": {"evolution": True}})
    settings = config.tables["a.t"]
    manager = TableManager(catalog, config)
    table = manager.ensure("a.t", settings, sample=pa.table({"customer": pa.array([{"id": "c1"}])}))
    odd = pa.table({"customer": pa.array([{"id": "c2", ".": "dot", "[0]": 7, ".x": True}])})
    schema = manager.evolve("a.t", table, odd, settings).schema()
    customer = schema.find_field("customer").field_type
    assert [field.name for field in customer.fields] == ["id", ".", "[0]", ".x"]


def test_evolution_off_changes_nothing(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(catalog_settings, {"a.t": {}})
    manager = TableManager(catalog, config)
    table = manager.ensure("a.t", config.tables["a.t"], sample=pa.table({"id": [1]}))
    after = manager.evolve("a.t", table, pa.table({"id": [1], "new": ["x"]}), config.tables["a.t"])
    assert after.schema().column_names == ["id"]


def test_concurrent_evolution_converges(catalog_settings: CatalogSettings, catalog: Any) -> None:
    """Workers with their own catalog connections evolve one table at once; all changes land once."""
    config = _config(catalog_settings, {"a.t": {"evolution": True}})
    settings = config.tables["a.t"]
    TableManager(catalog, config).ensure("a.t", settings, sample=pa.table({"id": [1]}))
    workers = 4
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            own = TableManager(load_catalog(catalog_settings), config)
            table = own.ensure("a.t", settings)
            rows = pa.table({"id": [1], "shared": ["s"], f"col_{i}": [i]})
            barrier.wait()
            own.evolve("a.t", table, rows, settings)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    final = catalog.load_table("a.t")
    names = final.schema().column_names
    assert sorted(names) == sorted(["id", "shared", *[f"col_{i}" for i in range(workers)]])
    # Each worker committed exactly one schema change on top of the created schema.
    assert len(final.metadata.schemas) == workers + 1


def test_concurrent_auto_create_converges(catalog_settings: CatalogSettings, catalog: Any) -> None:
    """Workers that see a new table at the same moment all end up with the one table."""
    config = _config(catalog_settings, {"a.new": {"partition-by": ["bucket[4](id)"]}})
    settings = config.tables["a.new"]
    workers = 4
    barrier = threading.Barrier(workers)
    uuids: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            own = TableManager(load_catalog(catalog_settings), config)
            barrier.wait()
            uuids.append(own.ensure("a.new", settings, sample=pa.table({"id": [1]})).metadata.table_uuid)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(set(uuids)) == 1 and len(uuids) == workers
    assert catalog.load_table("a.new").metadata.table_uuid == uuids[0]


def test_cached_tables_expire(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(catalog_settings, {"a.t": {}})
    manager = TableManager(catalog, config, max_age_seconds=0.0)
    table = manager.ensure("a.t", config.tables["a.t"], sample=pa.table({"id": [1]}))
    with catalog.load_table("a.t").update_schema() as update:  # another worker's change
        update.add_column("other", StringType())
    assert manager.ensure("a.t", config.tables["a.t"]).schema().column_names == ["id", "other"]
    assert table.schema().column_names == ["id"]


def test_a_created_table_is_the_catalogs_answer_to_the_create_not_a_second_load(
    catalog_settings: CatalogSettings, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole database's first batch creates hundreds of tables (issue 32): loading each again right
    after its create cost ~9 ms a table (metadata read and parsed once more)."""
    config = _config(catalog_settings, {"a.t": {}})
    created: list[Any] = []
    create = sql_catalog.create_table  # a SQL catalog's creates take this path (see the next test)

    def spy(*args: Any, **kwargs: Any) -> Any:
        created.append(create(*args, **kwargs))
        return created[-1]

    monkeypatch.setattr(sql_catalog, "create_table", spy)
    table = TableManager(catalog, config).ensure("a.t", config.tables["a.t"], sample=pa.table({"id": [1]}))
    assert len(created) == 1 and table is created[0]
    assert table.metadata.table_uuid == catalog.load_table("a.t").metadata.table_uuid


def test_a_create_in_a_namespace_already_seen_asks_the_sql_catalog_only_what_it_needs(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """A whole database's first batch creates hundreds of tables in one namespace (issue 50's 300
    tables side by side: the creates were 60 % of the workers' batch). Each create ran 7 statements:
    the manager's load, the namespace asked for three times (the manager's create-if-missing,
    PyIceberg's create, the namespace's location), its properties, the insert, and the table loaded
    again after it. Now the manager knows the namespace and where its tables go after its first
    create, and the table is the metadata the create wrote."""
    from sqlalchemy import event

    config = parse_config(
        {
            "name": "shop",
            "source": {"topics": ["orders"]},
            "catalog": catalog_settings.model_dump(),
            "dynamic": {"table": "tbl", "auto-create": True, "applies-to": "all"},
        },
        "test",
        base_dir=REPO,
    )
    assert config.dynamic is not None
    settings = config.dynamic.table_settings()
    manager = TableManager(catalog, config)
    manager.ensure("db.t0", settings, sample=pa.table({"id": [0]}))
    statements: list[str] = []
    event.listen(catalog.engine, "before_cursor_execute", lambda *args: statements.append(args[2].lstrip()))
    table = manager.ensure("db.t1", settings, sample=pa.table({"id": [1]}))
    # The manager's load (no such table), then the insert; nothing after it.
    assert [s.split()[0] for s in statements] == ["SELECT", "INSERT"], statements
    loaded = catalog.load_table("db.t1")
    assert table.metadata_location == loaded.metadata_location
    assert table.metadata.table_uuid == loaded.metadata.table_uuid and table.schema() == loaded.schema()
    assert table.catalog is catalog and table.name() == ("db", "t1")
    # Where PyIceberg's own create puts a table of the namespace.
    reference = catalog.create_table("db.reference", schema=table.schema())
    assert table.location() == reference.location().removesuffix("/reference") + "/t1"
