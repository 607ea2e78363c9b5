"""``fanout-sink sql --consistent``'s views in Spark: a join of two tables at one round, while one of
them is a round ahead (its partner's commit of that round failed). The reading rules are
``tests/test_consistent_read.py``; the rounds are written as the coordinator writes them."""

from __future__ import annotations

from typing import Any

from support.common import commit_as_round, create_tables, register_spark_catalog

from fanout_sink import consistent_read
from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark import consistent_views

SINK = "shop"


def test_the_views_join_orders_and_payments_at_the_round_both_hold(
    spark: Any, catalog: Any, catalog_settings: CatalogSettings
) -> None:
    create_tables(catalog, ["orders", "payments", "refunds"])
    commit_as_round(catalog, SINK, "orders", "r1", 10, 2, [1, 2])
    commit_as_round(catalog, SINK, "payments", "r1", 10, 2, [1])
    commit_as_round(catalog, SINK, "payments", "r2", 20, 1, [2])  # orders had no files in r2
    commit_as_round(catalog, SINK, "orders", "r3", 30, 3, [3])  # payments' commit of r3 failed
    commit_as_round(catalog, SINK, "refunds", "r3", 30, 3, [3])
    name = register_spark_catalog(spark, catalog_settings)
    point = consistent_read.latest_point(catalog, SINK)

    line = consistent_views.register(spark, point, name)

    assert line.startswith("reading sink 'shop' at round r2 (control offset 20): orders = sink.orders @ ")
    assert "refunds = sink.refunds @ empty" in line
    joined = spark.sql(
        "SELECT o.id, p.id IS NOT NULL AS paid FROM orders o LEFT JOIN payments p USING (id) ORDER BY o.id"
    ).collect()
    assert [(row.id, row.paid) for row in joined] == [(1, True), (2, True)], "orders read ahead of payments"
    assert spark.sql("SELECT count(*) AS n FROM refunds").collect()[0].n == 0
    assert spark.sql(f"SELECT count(*) AS n FROM {name}.sink.orders").collect()[0].n == 3, "the table itself"
