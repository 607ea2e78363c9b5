"""Position deletes the sink commits are read alike by Spark SQL and PyIceberg, before and after
Spark's own maintenance folds them (``rewrite_position_delete_files``, ``rewrite_data_files`` with a
delete-file threshold), and the sink keeps resolving changes correctly on the tables Spark rewrote.

One JDBC catalog on the same SQLite file for both engines (the suite's shared Spark session).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType
from support.row_deltas import commit_round

from fanout_sink.protocol import datafiles, row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "v", LongType(), required=False),
    identifier_field_ids=[1],
)
Model = dict[int, tuple[str, int]]


def _change(table: Table, model: Model, upserts: Model, deletes: list[int]) -> row_delta.ChangeSet:
    rows = pa.Table.from_pylist(
        [{"id": k, "region": r, "v": v} for k, (r, v) in sorted(upserts.items())], schema=SCHEMA.as_arrow()
    )
    model.update(upserts)
    for key in deletes:
        model.pop(key, None)
    return row_delta.ChangeSet(
        data_files=datafiles.write_data_files(table, rows) if upserts else [],
        deleted_keys=pa.table({"id": pa.array(deletes, pa.int64())}),
    )


def _round(catalog: Catalog, model: Model, *changes: tuple[Model, list[int]]) -> row_delta.Resolution:
    """One coordinator round on the freshly loaded table: resolve, then data + deletes in one snapshot."""
    table = catalog.load_table("ns.t")
    sets = [_change(table, model, upserts, deletes) for upserts, deletes in changes]
    return commit_round(table, ["id"], sets)


def _both(
    spark: Any, name: str, catalog: Catalog
) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    spark.sql(f"REFRESH TABLE {name}")  # Spark's catalog caches the table; the sink committed since
    spark_rows = [
        (r.id, r.region, r.v) for r in spark.sql(f"SELECT id, region, v FROM {name} ORDER BY id").collect()
    ]
    py_rows = sorted(
        (r["id"], r["region"], r["v"]) for r in catalog.load_table("ns.t").scan().to_arrow().to_pylist()
    )
    return spark_rows, py_rows


def _expected(model: Model) -> list[tuple[int, str, int]]:
    return [(k, r, v) for k, (r, v) in sorted(model.items())]


def test_spark_and_pyiceberg_read_the_sinks_deletes_alike_through_spark_maintenance(
    spark: Any, spark_catalog: str, catalog: Catalog
) -> None:
    catalog.create_namespace("ns")
    catalog.create_table(
        "ns.t",
        schema=SCHEMA,
        partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region")),
        properties={"format-version": "2"},
    )
    name = f"{spark_catalog}.ns.t"
    model: Model = {}
    _round(catalog, model, ({k: ("eu" if k % 2 else "us", k) for k in range(40)}, []))
    # Updates (some moving region), deletes, a key changed in two sets of one round, an absent delete.
    _round(
        catalog,
        model,
        ({1: ("us", 100), 2: ("us", 200), 5: ("eu", 500), 41: ("eu", 41)}, [3, 4, 99]),
        ({5: ("us", 501), 6: ("eu", 600)}, [2, 7]),
    )
    _round(catalog, model, ({8: ("eu", 800), 9: ("us", 900)}, [10, 11]))
    spark_rows, py_rows = _both(spark, name, catalog)
    assert spark_rows == py_rows == _expected(model)
    operations = [
        r.operation
        for r in spark.sql(f"SELECT operation FROM {name}.snapshots ORDER BY committed_at").collect()
    ]
    assert operations == ["append", "overwrite", "overwrite"]
    assert spark.sql(f"SELECT count(*) AS n FROM {name}.delete_files").collect()[0].n >= 3

    spark.sql(
        f"CALL {spark_catalog}.system.rewrite_position_delete_files("
        "table => 'ns.t', options => map('rewrite-all', 'true'))"
    )
    spark_rows, py_rows = _both(spark, name, catalog)
    assert spark_rows == py_rows == _expected(model)

    # The sink resolves against the delete files Spark wrote: already-deleted rows are not counted.
    after_rewrite = _round(catalog, model, ({1: ("eu", 101), 12: ("us", 1200)}, [3, 13]))
    assert (after_rewrite.inserted, after_rewrite.updated, after_rewrite.deleted) == (0, 2, 1)
    spark_rows, py_rows = _both(spark, name, catalog)
    assert spark_rows == py_rows == _expected(model)

    spark.sql(
        f"CALL {spark_catalog}.system.rewrite_data_files(table => 'ns.t', "
        "options => map('delete-file-threshold', '1', 'min-input-files', '1', "
        "'remove-dangling-deletes', 'true'))"
    )
    spark_rows, py_rows = _both(spark, name, catalog)
    assert spark_rows == py_rows == _expected(model)
    table = catalog.load_table("ns.t")
    assert not [t for t in table.scan().plan_files() if t.delete_files], "compaction left deletes applied"

    # And on the compacted files: positions are those of the rewritten files.
    after_compaction = _round(catalog, model, ({14: ("eu", 1400), 50: ("us", 50)}, [15, 1]))
    assert (after_compaction.inserted, after_compaction.updated, after_compaction.deleted) == (1, 1, 2)
    spark_rows, py_rows = _both(spark, name, catalog)
    assert spark_rows == py_rows == _expected(model)
