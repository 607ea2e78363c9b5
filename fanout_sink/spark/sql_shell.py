"""``fanout-sink sql``: Spark SQL on the sink's catalog, with the app's jars and catalog settings.

The session comes from :func:`fanout_sink.spark.session.build_spark_session` with the config's
``catalog:`` section, so a query reaches the same catalog and the same files the sink writes: the
embedded SQLite catalog, PostgreSQL, REST (and its S3 store) alike. The sink's catalog is Spark's
default catalog too, so ``shop.orders`` and ``lake.shop.orders`` name the same table.

Statements come from ``-e``, a file (``-f``, several statements separated by ``;``) or an
interactive prompt; results print as an aligned table, as JSON lines (one object per row) or as CSV.
A SQL error prints Spark's message, without the Java stack unless asked for, and the command exits
non-zero: a script can rely on the exit code. A query reading a table the catalog does not have is
answered by the catalog instead, with the tables of that namespace (:mod:`.missing_tables`): the
first statement's before Spark starts.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import csv
import io
import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TextIO

from fanout_sink import consistent_read
from fanout_sink.config.models import SinkConfig
from fanout_sink.spark import consistent_views

OutputFormat = Literal["table", "json", "csv"]
FORMATS: tuple[OutputFormat, ...] = ("table", "json", "csv")

DRIVER_MEMORY = "512m"
"""The driver heap unless ``--conf spark.driver.memory=...`` says otherwise: a local query session
needs little, and the machine may run the sink beside it."""

EXIT_WORDS = frozenset({"exit", "quit", r"\q"})
"""What ends the interactive prompt (a trailing ``;`` is allowed)."""


# --------------------------------------------------------------------------------------------
# Statements


def scan_statements(text: str) -> tuple[list[str], str]:
    """The ``;``-terminated statements in ``text`` and what follows the last ``;`` (unfinished).

    A ``;`` inside quotes (``'..'``, ``".."``, backticks) or a comment (``-- ..`` to the end of
    the line, ``/* .. */``) does not end a statement; comments stay in the statement text (Spark's
    parser skips them). Empty statements (``;;``) are dropped.
    """
    statements: list[str] = []
    start = 0
    index = 0
    quote: str | None = None
    length = len(text)
    while index < length:
        char = text[index]
        if quote is not None:
            if char == "\\" and quote != "`":
                index += 2
                continue
            if char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
        elif text.startswith("--", index):
            newline = text.find("\n", index)
            index = length if newline < 0 else newline
            continue
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            index = length if end < 0 else end + 2
            continue
        elif char == ";":
            statement = text[start:index].strip()
            if _has_sql(statement):
                statements.append(statement)
            start = index + 1
        index += 1
    return statements, text[start:]


def split_statements(text: str) -> list[str]:
    """Every statement in a script (``-e`` or ``-f``); the last one needs no ``;``."""
    statements, rest = scan_statements(text)
    return [*statements, rest.strip()] if _has_sql(rest) else statements


def _has_sql(text: str) -> bool:
    """Whether ``text`` holds more than whitespace and comments."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    remaining = "\n".join(lines).strip()
    while remaining.startswith("/*") and "*/" in remaining:
        remaining = remaining[remaining.index("*/") + 2 :].strip()
    return bool(remaining)


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Result:
    """One statement's answer: column names and rows of JSON-ready values (see :func:`plain`)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def plain(value: Any) -> Any:
    """A value from Arrow's ``to_pylist`` as JSON can carry it: decimals as strings (exact),
    dates and times ISO 8601 (a ``timestamp`` with its ``+00:00``, a ``timestamp_ntz`` without),
    binary as base64; maps and structs are objects already, lists stay lists."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def _cell(value: Any, null: str) -> str:
    """A value as text in a table or CSV cell: nested values as JSON, NULL as ``null``."""
    if value is None:
        return null
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def render(result: Result, output: OutputFormat) -> str:
    """The result as text, ending with a newline (empty for a statement without columns)."""
    if not result.columns:
        return ""
    if output == "json":
        return "".join(
            json.dumps(dict(zip(result.columns, row, strict=True)), ensure_ascii=False) + "\n"
            for row in result.rows
        )
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([_cell(value, "") for value in row] for row in result.rows)
        return buffer.getvalue()
    return _table(result)


def _table(result: Result) -> str:
    """An aligned table with a header rule and a row count, as ``psql`` prints one."""
    cells = [[_cell(value, "NULL").replace("\n", "\\n") for value in row] for row in result.rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(result.columns)]

    def line(values: Iterable[str]) -> str:
        return " | ".join(value.ljust(width) for value, width in zip(values, widths, strict=True)).rstrip()

    rule = "-+-".join("-" * width for width in widths)
    count = len(cells)
    body = [line(result.columns), rule, *(line(row) for row in cells)]
    return "\n".join(body) + f"\n({count} row{'' if count == 1 else 's'})\n"


# --------------------------------------------------------------------------------------------
# Running statements


class SqlError(Exception):
    """A statement Spark refused or failed; the message is Spark's, without the Java stack."""


def spark_message(exc: BaseException) -> str:
    """Spark's own message for ``exc``: the error class and text of an analysis or parse error,
    or the first line (the Java exception and its message) of an uncaught JVM error."""
    from py4j.protocol import Py4JJavaError

    if isinstance(exc, Py4JJavaError):
        return str(exc.java_exception.toString()).strip()
    text = str(exc).strip()
    marker = "\n\nJVM stacktrace:"  # present only with spark.sql.pyspark.jvmStacktrace.enabled
    return text.split(marker, 1)[0] if marker in text else text


_NO_VIEW_SUPPORT = "JDBC catalog is initialized without view support"
"""Iceberg's JDBC catalog on a database of its V0 schema (made by Iceberg Java before views existed)
answers every view lookup with this error. Spark looks for a view once no table has a statement's
name, so a misspelt table name surfaced as this instead of Spark's TABLE_OR_VIEW_NOT_FOUND."""


def read_relations(spark: Any, statement: str) -> list[tuple[str, ...]]:
    """The names of the tables and views ``statement`` reads at its top level, as written (Spark's
    parser, before the analysis that failed); nothing when it does not parse."""
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
        leaves = plan.collectLeaves()
        names = []
        for index in range(leaves.length()):
            leaf = leaves.apply(index)
            if leaf.getClass().getSimpleName() == "UnresolvedRelation":
                parts = leaf.multipartIdentifier()
                names.append(tuple(str(parts.apply(n)) for n in range(parts.length())))
    except Exception:  # only a better message is at stake: Spark's own error is reported then
        return []
    return names


def execute(
    spark: Any, statement: str, table_exists: Callable[[tuple[str, ...]], bool] | None = None
) -> Result:
    """Run one statement and collect its rows; :class:`SqlError` when Spark refuses or fails it.

    Rows come through Arrow: its timestamps carry their zone (UTC, the session's) whatever the
    zone of this process, where ``collect()`` would give naive local times.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        frame = spark.sql(statement)
        columns = list(frame.columns)
        # Column by column: a result may name two columns alike (SELECT 1 AS a, 2 AS a).
        table = frame.toArrow() if columns else None
        values = (
            [column.to_pylist(maps_as_pydicts="lossy") for column in table.columns]
            if table is not None
            else []
        )
    except (PySparkException, Py4JJavaError) as exc:
        message = spark_message(exc)
        if _NO_VIEW_SUPPORT in message and table_exists is not None:
            missing = [name for name in read_relations(spark, statement) if not table_exists(name)]
            if missing:
                message = (
                    f"[TABLE_OR_VIEW_NOT_FOUND] The table or view {', '.join('.'.join(n) for n in missing)} "
                    "cannot be found. (Spark then looked for a view of that name, which this Iceberg JDBC "
                    "catalog's database, of Iceberg's V0 schema, cannot hold: with jdbc.schema-version: V1 "
                    "in the catalog section Iceberg migrates it and views work.)"
                )
        raise SqlError(message) from exc
    return Result(columns, [tuple(plain(value) for value in row) for row in zip(*values, strict=True)])


@dataclass
class Shell:
    """Runs statements against one Spark session and prints their results to ``out``, errors to
    ``err`` (with the Python and Java stacks when ``verbose``)."""

    spark: Any
    output: OutputFormat = "table"
    verbose: bool = False
    out: TextIO = sys.stdout
    err: TextIO = sys.stderr
    table_exists: Callable[[tuple[str, ...]], bool] | None = None
    """Whether the catalog has a table of a name as a statement writes it: names the missing table
    where the catalog's own error would not (see :data:`_NO_VIEW_SUPPORT`)."""
    check: Callable[[str], str | None] | None = None
    """Why a statement reads a table the catalog does not have, asked before it runs
    (:func:`fanout_sink.spark.missing_tables.checker`); None: let Spark run it."""

    def run_one(self, statement: str) -> bool:
        """Run and print one statement; False when it failed (the error is printed)."""
        missing = self.check(statement) if self.check is not None else None
        if missing is not None:
            print(f"fanout-sink sql: {missing}", file=self.err, flush=True)
            return False
        try:
            result = execute(self.spark, statement, self.table_exists)
        except SqlError as exc:
            if self.verbose and exc.__cause__ is not None:
                traceback.print_exception(exc.__cause__, file=self.err)
            print(f"fanout-sink sql: {exc}", file=self.err, flush=True)
            return False
        self.out.write(render(result, self.output))
        self.out.flush()
        return True

    def run_script(self, text: str) -> int:
        """Run every statement in order, stopping at the first that fails: exit code 0 or 1."""
        statements = split_statements(text)
        if not statements:
            print("fanout-sink sql: no statement given", file=self.err)
            return 2
        for statement in statements:
            if not self.run_one(statement):
                return 1
        return 0

    def prompt(self, read_line: Callable[[str], str], interactive: bool) -> int:
        """The interactive loop: ``;`` ends a statement, ``exit``/``quit``/EOF end the session.

        A failed statement does not end it; the exit code is 1 when any statement failed (so
        statements piped in still tell a script whether all of them ran).
        """
        failed = False
        pending = ""
        while True:
            try:
                line = read_line(("   > " if pending else "sql> ") if interactive else "")
            except EOFError:
                break
            except KeyboardInterrupt:  # Ctrl-C drops the statement being typed, as psql does
                pending = ""
                print(file=self.err)
                continue
            if not _has_sql(pending) and line.strip().rstrip(";").strip().lower() in EXIT_WORDS:
                break
            statements, pending = scan_statements(pending + line + "\n")
            for statement in statements:
                failed = not self.run_one(statement) or failed
            if not _has_sql(pending):
                pending = ""  # a comment after the last statement starts nothing
        if _has_sql(pending):
            failed = not self.run_one(pending.strip()) or failed
        return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# The command


def session_conf(config: SinkConfig, extra: Mapping[str, str], verbose: bool) -> dict[str, str]:
    """The Spark properties the SQL session adds to the sink's: the sink's catalog as the default
    one, a small driver heap, Java stacks only when ``verbose``; ``extra`` (``--conf``) wins."""
    return {
        "spark.sql.defaultCatalog": config.catalog.name,
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.sql.pyspark.jvmStacktrace.enabled": str(verbose).lower(),
        **extra,
    }


def quiet_statement_logs(spark: Any) -> None:
    """Unless ``--verbose``, a failed statement's error is printed once, by the shell: Spark's own
    lines below ERROR (a catalog's warnings on first use) and PySpark's log of every error that has a
    query context (a misspelt name, a parse error: one JSON line with the whole Java stack) are off."""
    from pyspark.logger import PySparkLogger

    spark.sparkContext.setLogLevel("ERROR")
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def catalog_lookup(config: SinkConfig) -> Callable[[tuple[str, ...]], bool]:
    """Whether the sink's catalog has a table of a name as a statement writes it (``orders`` in the
    session's namespace ``default``, ``shop.orders``, ``<catalog>.shop.orders``), through PyIceberg.

    A SQL catalog is loaded at once, before Spark's session: a new database is then made by PyIceberg,
    in the schema that holds views too, which Iceberg Java then uses; Iceberg Java making it first
    would make the V0 schema (see :data:`_NO_VIEW_SUPPORT`). Other catalogs are loaded only if a
    lookup is asked for, which only a JDBC catalog's error leads to: a REST server sees Spark's
    requests alone."""
    from fanout_sink.catalog import load_catalog

    loaded = [load_catalog(config.catalog, create=False)] if config.catalog.type == "sql" else []

    def exists(name: tuple[str, ...]) -> bool:
        parts = name[1:] if len(name) == 3 and name[0] == config.catalog.name else name
        if len(parts) == 1:
            parts = ("default", *parts)
        try:
            if not loaded:
                loaded.append(load_catalog(config.catalog, create=False))
            return bool(loaded[0].table_exists(parts))
        except Exception:  # a name the catalog cannot even look up is not one it has
            return False

    return exists


def _history_file() -> Path:
    from fanout_sink import jars

    return jars.cache_dir() / "sql_history"


def _read_line_with_history() -> Callable[[str], str]:
    """``input`` with readline's line editing and a history kept across sessions (when readline is
    there: it is not on every platform)."""
    try:
        import readline
    except ImportError:
        return input
    history = _history_file()
    with contextlib.suppress(OSError):
        readline.read_history_file(history)

    def save() -> None:
        with contextlib.suppress(OSError):
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)

    atexit.register(save)
    return input


def run(
    config: SinkConfig,
    *,
    execute_text: str | None = None,
    script: Path | None = None,
    output: OutputFormat = "table",
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    verbose: bool = False,
    consistent: bool = False,
) -> int:
    """``fanout-sink sql``: run ``execute_text`` or the file ``script``, else prompt on stdin;
    ``consistent``: every table of the sink first registered as a view at the newest round all of
    them hold (:mod:`fanout_sink.spark.consistent_views`; found before Spark starts)."""
    from fanout_sink.catalog import load_catalog
    from fanout_sink.spark import missing_tables
    from fanout_sink.spark.session import build_spark_session

    text = execute_text
    if script is not None:
        try:
            text = script.read_text(encoding="utf-8")
        except OSError as exc:
            print(
                f"fanout-sink sql: cannot read {script}: {exc.strerror}; pass -f <file.sql>", file=sys.stderr
            )
            return 2
    check = missing_tables.checker(lambda: load_catalog(config.catalog), config.catalog.name)
    statements = split_statements(text) if text is not None else []
    # A mistyped name in the first statement is answered by the catalog, before Spark starts (seconds).
    missing = check(statements[0]) if statements else None
    if missing is not None:
        print(f"fanout-sink sql: {missing}", file=sys.stderr)
        return 1
    table_exists = catalog_lookup(config)
    point = None
    if consistent:  # before Spark starts: without a point there is nothing to query
        point = consistent_read.latest_point(load_catalog(config.catalog, create=False), config.name)
    spark = build_spark_session(
        config.catalog,
        master=master or "local[*]",
        app_name=f"{config.name}-sql",
        extra_conf=session_conf(config, extra_conf or {}, verbose),
        log_format=config.logging.format,
    )
    if not verbose:
        quiet_statement_logs(spark)
    try:
        if point is not None:
            print(
                f"fanout-sink sql: {consistent_views.register(spark, point, config.catalog.name)}",
                file=sys.stderr,
            )
        shell = Shell(spark, output, verbose, table_exists=table_exists, check=check)
        if text is not None:
            return shell.run_script(text)
        interactive = sys.stdin.isatty()
        read_line = _read_line_with_history() if interactive else input
        return shell.prompt(read_line, interactive)
    finally:
        spark.stop()
