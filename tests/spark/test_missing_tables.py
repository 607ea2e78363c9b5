"""Which tables a query reads, as ``fanout-sink sql`` looks them up in the catalog before Spark runs
it (the command's answers: ``tests/e2e/test_sql_cli.py``)."""

from __future__ import annotations

from pathlib import Path

from support.common import embedded_catalog_settings

from fanout_sink.catalog import load_catalog
from fanout_sink.spark.missing_tables import LISTED, checker, missing_table, read_names


def test_the_names_a_query_reads_are_its_qualified_from_and_join_names() -> None:
    statement = """
        WITH recent AS (SELECT * FROM shop.orders WHERE note = 'from raw.fake join x.y')
        -- FROM comment.ignored
        SELECT * FROM recent r JOIN `lake`.`shop`.`pay``ments` p ON r.id = p.id, raw.clicks
        LEFT JOIN (SELECT * FROM shop.orders.snapshots) s ON true
        CROSS JOIN shop.udf(1) /* FROM block.comment */
    """
    assert read_names(statement) == [
        ("shop", "orders"),
        ("lake", "shop", "pay`ments"),
        ("shop", "orders", "snapshots"),
    ]
    # Not a query: DDL and SHOW name namespaces and new tables after FROM/TABLE.
    assert read_names("SHOW TABLES FROM shop") == []
    assert read_names("CREATE TABLE shop.t AS SELECT * FROM shop.orders") == []
    assert read_names("DELETE FROM shop.orders WHERE id = 1") == []


def test_a_missing_table_names_its_namespaces_tables_and_a_missing_namespace_the_namespaces(
    tmp_path: Path,
) -> None:
    settings = embedded_catalog_settings(tmp_path)
    catalog = load_catalog(settings)
    catalog.create_namespace("shop")
    catalog.create_namespace("raw")
    from support.common import TABLE_SCHEMA

    for i in range(LISTED + 2):
        catalog.create_table(f"shop.t{i:02d}", schema=TABLE_SCHEMA)
    name = settings.name
    assert missing_table(catalog, name, ("shop", "t00")) is None
    assert missing_table(catalog, name, (name, "shop", "t01", "history")) is None
    assert missing_table(catalog, name, ("spark_catalog", "shop", "nope")) is None  # not this catalog's
    answer = missing_table(catalog, name, ("shop", "nope"))
    assert answer is not None and answer.startswith(
        "table shop.nope does not exist; the tables of namespace shop: shop.t00, shop.t01,"
    )
    assert answer.endswith(f"shop.t{LISTED - 1:02d} and 2 more")
    assert missing_table(catalog, name, ("shpo", "t00")) == (
        "namespace shpo does not exist (table shpo.t00); the namespaces: raw, shop"
    )


def test_a_catalog_that_cannot_be_asked_leaves_the_statement_to_spark() -> None:
    def unreachable() -> object:
        raise ConnectionError("refused")

    check = checker(unreachable, "lake")  # type: ignore[arg-type]
    assert check("SELECT * FROM shop.orders") is None
    assert check("SELECT 1") is None
