"""The embedded catalog is one catalog for two engines: PyIceberg writes, Spark SQL reads the same."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "customer", StringType(), required=False),
    NestedField(3, "ts", TimestamptzType(), required=False),
)


def test_pyiceberg_table_reads_identically_in_spark_sql(spark: Any, spark_catalog: str, catalog: Any) -> None:
    catalog.create_namespace("analytics")
    table = catalog.create_table("analytics.orders", schema=SCHEMA)
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "customer": ["ada", None, "grace"],
            "ts": pa.array([1_700_000_000_000_000, 1_700_000_001_000_000, None], pa.timestamp("us", "UTC")),
        },
        schema=SCHEMA.as_arrow(),
    )
    table.append(
        rows, snapshot_properties={"fanout-sink.test.commit-id": "c-1", "fanout-sink.test.vtts": "42"}
    )

    spark_rows = spark.sql(
        f"SELECT id, customer, ts FROM {spark_catalog}.analytics.orders ORDER BY id"
    ).collect()
    py_rows = table.scan().to_arrow().sort_by("id").to_pylist()

    # Spark returns timestamps as naive datetimes in the session zone (UTC here); PyIceberg tz-aware.
    def naive(ts: Any) -> Any:
        return None if ts is None else ts.replace(tzinfo=None)

    assert [(r.id, r.customer, r.ts) for r in spark_rows] == [
        (r["id"], r["customer"], naive(r["ts"])) for r in py_rows
    ]
    assert [r.id for r in spark_rows] == [1, 2, 3]

    summaries = spark.sql(
        f"SELECT snapshot_id, summary FROM {spark_catalog}.analytics.orders.snapshots"
    ).collect()
    assert len(summaries) == 1
    assert summaries[0].snapshot_id == table.current_snapshot().snapshot_id
    assert summaries[0].summary["fanout-sink.test.commit-id"] == "c-1"
    assert summaries[0].summary["fanout-sink.test.vtts"] == "42"


def test_spark_sees_a_second_pyiceberg_commit(spark: Any, spark_catalog: str, catalog: Any) -> None:
    """Spark must not serve a stale cached snapshot after the sink commits again."""
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=SCHEMA)
    table.append(pa.table({"id": pa.array([1], pa.int64())}).cast(pa.schema([SCHEMA.as_arrow().field("id")])))
    assert spark.sql(f"SELECT count(*) AS n FROM {spark_catalog}.ns.t").collect()[0].n == 1
    table.append(
        pa.table({"id": pa.array([2, 3], pa.int64())}).cast(pa.schema([SCHEMA.as_arrow().field("id")]))
    )
    spark.sql(f"REFRESH TABLE {spark_catalog}.ns.t")
    assert spark.sql(f"SELECT count(*) AS n FROM {spark_catalog}.ns.t").collect()[0].n == 3
