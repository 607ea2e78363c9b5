"""``fanout-sink sql`` on the embedded catalog (SQLite): the rows PyIceberg reads, as JSON, CSV or a
table; several statements from a file; Spark's message and a non-zero exit on a bad statement; the
prompt. The REST and PostgreSQL catalogs are checked beside their other Spark tests
(``tests/spark/test_spark_object_store.py``)."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.common import embedded_catalog_settings, register_spark_catalog
from support.sql_cli import pyiceberg_rows, run_sql_cli, write_sql_config

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.spark.sql_shell import Result, Shell, catalog_lookup, render, split_statements

ORDERS = pa.table(
    {
        "id": pa.array([3, 1, 2], pa.int64()),
        "customer": ["grace", 'ada, "the first"', None],
        "amount": pa.array([Decimal("10.50"), Decimal("0.01"), None], pa.decimal128(10, 2)),
        "ts": pa.array([1_700_000_000_000_000, None, 1_700_000_001_500_000], pa.timestamp("us", "UTC")),
        "tags": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
    }
)


def _orders(settings: CatalogSettings) -> str:
    """``shop.orders`` with the rows above, written by PyIceberg; its identifier."""
    catalog = load_catalog(settings)
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", schema=ORDERS.schema)
    table.append(ORDERS)
    return "shop.orders"


# --------------------------------------------------------------------------------------------
# Without Spark: statements and output formats


def test_statements_split_on_semicolons_outside_quotes_and_comments() -> None:
    script = """
        SELECT 'a;b' AS x, "c;d", `e;f` FROM t;  -- a comment; with a semicolon
        /* a block; comment */ SELECT 2;;
        SELECT 'it\\'s'   -- the last statement needs no semicolon
    """
    assert split_statements(script) == [
        "SELECT 'a;b' AS x, \"c;d\", `e;f` FROM t",
        "-- a comment; with a semicolon\n        /* a block; comment */ SELECT 2",
        "SELECT 'it\\'s'   -- the last statement needs no semicolon",
    ]
    assert split_statements("-- only a comment;\n /* and another */") == []


def test_render_formats_a_result_for_people_and_for_scripts() -> None:
    result = Result(["id", "name", "tags"], [(1, "a,b", ["x"]), (2, None, {"k": "v"})])
    assert render(result, "table") == (
        'id | name | tags\n---+------+-----------\n1  | a,b  | ["x"]\n2  | NULL | {"k": "v"}\n(2 rows)\n'
    )
    assert [json.loads(line) for line in render(result, "json").splitlines()] == [
        {"id": 1, "name": "a,b", "tags": ["x"]},
        {"id": 2, "name": None, "tags": {"k": "v"}},
    ]
    assert list(csv.reader(io.StringIO(render(result, "csv")))) == [
        ["id", "name", "tags"], ["1", "a,b", '["x"]'], ["2", "", '{"k": "v"}']
    ]  # fmt: skip
    assert render(Result([], []), "table") == ""  # DDL prints nothing


# --------------------------------------------------------------------------------------------
# The command, each run in a JVM of its own


@pytest.mark.usefixtures("own_spark")
def test_sql_f_prints_the_rows_pyiceberg_reads_in_order_and_stops_at_spark_s_error(tmp_path: Path) -> None:
    """One JVM for the output and the script's flow: ``-e`` takes the same path with one statement
    (run as printed by ``tests/e2e/test_demo.py``, and on the REST and PostgreSQL catalogs by
    ``tests/spark/test_spark_object_store.py``, in CSV too)."""
    settings = embedded_catalog_settings(tmp_path)
    identifier = _orders(settings)
    config = write_sql_config(tmp_path, settings)
    script = tmp_path / "report.sql"
    script.write_text(
        f"SELECT * FROM {identifier} ORDER BY id;\n"
        f"-- the sink's catalog is the default one, and it answers by its name too;\n"
        f"SELECT id, customer FROM {identifier} WHERE amount IS NOT NULL ORDER BY id;\n"
        f"SELECT count(*) AS n FROM {settings.name}.{identifier};\n"
        f"SELECT * FROM shop.no_such_table;\n"
        f"SELECT 'never run' AS after_the_error;\n"
    )

    done = run_sql_cli("--config", str(config), "--format", "json", "-f", str(script))

    assert done.returncode == 1, done.stderr[-3000:]
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    everything, rest = printed[:3], printed[3:]
    assert everything == pyiceberg_rows(settings, identifier, "id")
    assert everything[0]["ts"] is None and everything[2]["ts"] == "2023-11-14T22:13:20+00:00"
    assert everything[2]["amount"] == "10.50" and everything[2]["tags"] == ["a", "b"]
    assert rest == [{"id": 1, "customer": 'ada, "the first"'}, {"id": 3, "customer": "grace"}, {"n": 3}]
    error = [line for line in done.stderr.splitlines() if line.startswith("fanout-sink sql:")]
    # The catalog's answer (before Spark's analysis): the table, and what the namespace holds.
    assert error == [
        "fanout-sink sql: table shop.no_such_table does not exist; the tables of namespace shop: shop.orders"
    ], done.stderr[-3000:]
    assert "\tat org.apache" not in done.stderr and "Traceback" not in done.stderr
    # Without --verbose the error is printed once, by the shell: not PySpark's JSON log of it (with
    # the whole Java stack), nor Spark's or the catalog's warnings (issue 35).
    assert "QueryContextLogger" not in done.stderr and "stackTrace" not in done.stderr, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if " WARN " in line], done.stderr[-3000:]


def test_a_mistyped_first_table_or_namespace_is_answered_by_the_catalog_without_spark(
    tmp_path: Path,
) -> None:
    """``--master nowhere`` would fail Spark's start: the answers come before it."""
    settings = embedded_catalog_settings(tmp_path)
    _orders(settings)
    load_catalog(settings).create_namespace("raw")
    config = write_sql_config(tmp_path, settings)
    for statement, answer in (
        (
            "SELECT o.id FROM shop.orders o JOIN shop.ordrs p ON o.id = p.id",
            "table shop.ordrs does not exist; the tables of namespace shop: shop.orders",
        ),
        (
            f"select * from {settings.name}.shpo.orders.snapshots",
            f"namespace shpo does not exist (table {settings.name}.shpo.orders.snapshots); "
            "the namespaces: raw, shop",
        ),
    ):
        done = run_sql_cli("--config", str(config), "--master", "nowhere", "-e", statement)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr[-3000:]
        assert done.stderr == f"fanout-sink sql: {answer}\n"


def test_sql_f_names_a_missing_file(tmp_path: Path) -> None:
    config = write_sql_config(tmp_path, embedded_catalog_settings(tmp_path))
    done = run_sql_cli("--config", str(config), "-f", str(tmp_path / "missing.sql"))
    assert done.returncode == 2
    assert f"cannot read {tmp_path / 'missing.sql'}" in done.stderr


def test_the_prompt_runs_statements_as_they_end_and_survives_errors(spark: Any, tmp_path: Path) -> None:
    settings = embedded_catalog_settings(tmp_path)
    identifier = _orders(settings)
    name = register_spark_catalog(spark, settings)
    lines = iter([
        f"SELECT id, amount FROM {name}.{identifier}", "ORDER BY id;",
        "SELECT nonsense;", f"SELECT count(*) AS n FROM {name}.{identifier}; -- done", "quit",
        "SELECT 'after quit';",
    ])  # fmt: skip

    def read_line(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    out, err = io.StringIO(), io.StringIO()
    code = Shell(spark, "table", out=out, err=err).prompt(read_line, interactive=False)

    assert code == 1  # one statement failed
    assert out.getvalue() == (
        "id | amount\n---+-------\n1  | 0.01\n2  | NULL\n3  | 10.50\n(3 rows)\nn\n-\n3\n(1 row)\n"
    )
    assert err.getvalue().startswith("fanout-sink sql: [UNRESOLVED_COLUMN")
    assert next(lines) == "SELECT 'after quit';"


def test_verbose_adds_the_stack_to_spark_s_message(spark: Any) -> None:
    quiet, verbose = io.StringIO(), io.StringIO()
    assert not Shell(spark, err=quiet).run_one("SELECT nonsense")
    assert not Shell(spark, verbose=True, err=verbose).run_one("SELECT nonsense")

    assert quiet.getvalue().startswith("fanout-sink sql: [UNRESOLVED_COLUMN")
    assert "Traceback" not in quiet.getvalue() and "\tat " not in quiet.getvalue()
    assert "Traceback (most recent call last)" in verbose.getvalue()
    assert verbose.getvalue().endswith(quiet.getvalue())


def test_a_missing_table_is_named_on_a_catalog_database_iceberg_java_made(spark: Any, tmp_path: Path) -> None:
    """Iceberg Java makes a new JDBC catalog's database in its V0 schema, where every view lookup
    fails, and Spark looks for a view once no table has the name: a misspelt table name came out as
    "JDBC catalog is initialized without view support" (issue 35). The shell names the missing one.
    (``fanout-sink sql`` has PyIceberg make a new database first, in the schema that holds views.)"""
    settings = embedded_catalog_settings(tmp_path)
    name = register_spark_catalog(spark, settings)
    spark.sql(f"CREATE TABLE {name}.shop.orders (id BIGINT)")  # Iceberg Java makes the database: V0
    err = io.StringIO()
    shell = Shell(
        spark, err=err, table_exists=catalog_lookup(load_config(write_sql_config(tmp_path, settings)))
    )

    assert not shell.run_one(f"SELECT * FROM {name}.shop.nope JOIN shop.orders USING (id)")

    message = err.getvalue()
    assert message.startswith(
        f"fanout-sink sql: [TABLE_OR_VIEW_NOT_FOUND] The table or view {name}.shop.nope "
    ), message
    assert "orders" not in message and "jdbc.schema-version: V1" in message
    assert shell.run_one(f"SELECT count(*) AS n FROM {name}.shop.orders"), err.getvalue()
