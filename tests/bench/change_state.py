"""A replica after the change stream: its rows checked key by key against the model, its delete files,
and what a full read costs through PyIceberg and Spark SQL before and after maintenance.

The key-by-key check is the benchmark's correctness gate: a system whose table differs from the
model in any key (missing, extra, duplicated, or a column that differs) has its mismatches counted,
printed with examples and kept in the report, never dropped. Maintenance is what a user would run
on a merge-on-read table: ``rewrite_data_files`` with ``delete-file-threshold=1`` (every data file
that has a delete is rewritten without its deleted rows) and ``rewrite_position_delete_files``
(compacts what is left and drops deletes that point at removed files).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.change_stream import COLUMNS, KEY, TABLE
from bench.table_health import median_s

EXAMPLES = 10


@dataclass(frozen=True)
class StateCheck:
    """A table's rows against the model: counts of each kind of mismatch and a few examples."""

    rows: int
    expected: int
    missing: int
    """Keys the model holds and the table does not."""
    extra: int
    """Keys the table holds and the model does not (deleted, or never there)."""
    duplicated: int
    """Keys the table holds more than once."""
    differing: int
    """Keys in both whose row differs in some column."""
    examples: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return self.missing + self.extra + self.duplicated + self.differing


def _ids(table: pa.Table, mask: pa.Array) -> list[int]:
    return [int(i) for i in table[KEY].filter(mask).slice(0, EXAMPLES).to_pylist()]


def check_state(landed: pa.Table, model: pa.Table) -> StateCheck:
    """Compare ``landed`` (the table read back) with ``model`` key by key, in Arrow."""
    landed = landed.select(COLUMNS).cast(model.schema)
    unique = pc.unique(landed[KEY])
    duplicated = len(landed) - len(unique)
    left = model.append_column("_model", pa.array([True] * len(model)))
    right = landed.append_column("_landed", pa.array([True] * len(landed)))
    joined = left.join(right, KEY, join_type="full outer", left_suffix="", right_suffix="_got")
    in_model = pc.fill_null(joined["_model"], False)
    in_landed = pc.fill_null(joined["_landed"], False)
    missing_mask = pc.invert(in_landed)
    extra_mask = pc.invert(in_model)
    both = pc.and_(in_model, in_landed)
    examples = [f"id {i}: missing" for i in _ids(joined, missing_mask)]
    examples += [f"id {i}: not in the model" for i in _ids(joined, extra_mask)]
    differs = pa.array([False] * len(joined))
    for column in COLUMNS:
        if column == KEY:
            continue
        want, got = joined[column], joined[f"{column}_got"]
        # Unequal values, or a null on one side only.
        column_differs = pc.fill_null(pc.not_equal(want, got), True)
        column_differs = pc.and_(column_differs, pc.invert(pc.and_(pc.is_null(want), pc.is_null(got))))
        column_differs = pc.and_(column_differs, both)
        for row in joined.filter(column_differs).slice(0, EXAMPLES).to_pylist():
            if len(examples) < 3 * EXAMPLES:
                examples.append(f"id {row[KEY]}: {column} {row[f'{column}_got']!r}, model {row[column]!r}")
        differs = pc.or_(differs, column_differs)
    differing = len(pc.unique(joined[KEY].filter(differs)))
    return StateCheck(
        rows=len(landed),
        expected=len(model),
        missing=int(pc.sum(missing_mask).as_py() or 0),
        extra=len(pc.unique(joined[KEY].filter(extra_mask))),
        duplicated=duplicated,
        differing=differing,
        examples=examples,
    )


@dataclass(frozen=True)
class TableFiles:
    """The current snapshot's files: what a reader opens."""

    data_files: int
    delete_files: int
    position_deletes: int
    snapshots: int
    """All the table's snapshots (one per commit until maintenance expires some)."""

    @classmethod
    def of(cls, table: Any) -> TableFiles:
        deletes = table.inspect.delete_files()
        return cls(
            data_files=table.inspect.data_files().num_rows,
            delete_files=deletes.num_rows,
            position_deletes=int(pc.sum(deletes["record_count"]).as_py() or 0) if deletes.num_rows else 0,
            snapshots=len(table.snapshots()),
        )


@dataclass(frozen=True)
class ReadCost:
    """One moment of a table: its files, median full-read seconds per engine, the rows Spark counts."""

    files: TableFiles
    pyiceberg_scan_s: float
    spark_count_s: float
    spark_rows: int


@dataclass(frozen=True)
class Replica:
    """A system's table after the stream: checked, measured, maintained, measured again."""

    check: StateCheck
    before: ReadCost
    maintenance_s: float
    after: ReadCost
    after_check: StateCheck

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["check"]["mismatches"] = self.check.mismatches
        out["after_check"]["mismatches"] = self.after_check.mismatches
        return out


def read_cost(catalog: Any, spark: Any, spark_table: str, repeat: int) -> ReadCost:
    spark.sql(f"REFRESH TABLE {spark_table}")
    rows = int(spark.sql(f"SELECT count(*) FROM {spark_table}").collect()[0][0])
    return ReadCost(
        files=TableFiles.of(catalog.load_table(TABLE)),
        pyiceberg_scan_s=median_s(lambda: catalog.load_table(TABLE).scan().to_arrow(), repeat),
        spark_count_s=median_s(lambda: spark.sql(f"SELECT count(*) FROM {spark_table}").collect(), repeat),
        spark_rows=rows,
    )


def maintain(spark: Any, spark_catalog: str) -> float:
    """Fold the deletes into the data files, then compact the position deletes; seconds taken.

    Spark's file-scoped position deletes outlive the data file a rewrite replaces (dangling), and
    PyIceberg still opens every delete file a scan plans, so both procedures are told to drop
    dangling deletes and the second to consider every delete file, not only groups of five."""
    started = time.perf_counter()
    table = f"{spark_catalog}.{TABLE}"  # qualified: a bare crm.customers is first tried as catalog crm
    spark.sql(
        f"CALL {spark_catalog}.system.rewrite_data_files(table => '{table}', options => "
        "map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
    ).collect()
    spark.sql(
        f"CALL {spark_catalog}.system.rewrite_position_delete_files(table => '{table}', "
        "options => map('rewrite-all', 'true'))"
    ).collect()
    return time.perf_counter() - started


def examine(catalog: Any, spark: Any, spark_catalog: str, model: pa.Table, repeat: int = 3) -> Replica:
    """Check, measure, maintain and measure again one system's replica (``spark`` has its catalog)."""
    spark_table = f"{spark_catalog}.{TABLE}"
    check = check_state(catalog.load_table(TABLE).scan().to_arrow(), model)
    before = read_cost(catalog, spark, spark_table, repeat)
    maintenance_s = maintain(spark, spark_catalog)
    after = read_cost(catalog, spark, spark_table, repeat)
    after_check = check_state(catalog.load_table(TABLE).scan().to_arrow(), model)
    return Replica(check, before, maintenance_s, after, after_check)
