"""Spark on the object store, configured only by the ``catalog:`` section PyIceberg takes.

Spark runs in a child process (``support/spark_s3_child.py``) because a process has one
SparkContext and the suite's shared one starts without the object-store jars; one child serves the
whole module (three catalogs, the checkpoint and the REST sink's maintenance), because each JVM start
costs ~20 s. Each test checks both directions through the real servers: PyIceberg writes and Spark SQL
(Iceberg's S3FileIO, AWS SDK v2) reads, Spark writes and PyIceberg (pyarrow's S3 filesystem) reads;
and the planner reads a real ``s3a://`` checkpoint that Spark's Kafka source wrote (Hadoop's S3A, same
SDK).

Before the child, the real app runs once on Iceberg's REST catalog + S3 (``rest_sink``): it
auto-creates a table partitioned by ``day(ts)``, adds a column when later records bring one, and
applies a Debezium change stream (position deletes) to a change table; the child then maintains both
tables (compaction folds the deletes) and reads them. What PyIceberg 0.12 sends for all of that (a
create transaction and schema updates with ``AddSchema``) is what Nessie 0.99 refused.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from bench.change_stream import create_table
from chaos.changes import ROUTE, ChangeTraffic, change_traffic
from confluent_kafka import Producer
from pyarrow import fs
from pyiceberg.types import StringType
from support.sink_factory import SinkUnderTest, new_sink
from support.sql_cli import pyiceberg_rows, run_sql_cli, write_sql_config
from support.stores_fixtures import (
    fresh_s3_prefix,
    postgres_s3_settings,
    rest_s3_settings,
    sqlite_s3_settings,
)

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.object_store import ObjectStoreState
from fanout_sink.devtools.stack.postgres import PostgresState
from fanout_sink.devtools.stack.rest_catalog import RestCatalogState

pytestmark = pytest.mark.usefixtures("own_spark")

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "spark_s3_child.py"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def run_spark(settings: CatalogSettings, *more: CatalogSettings, **spec: Any) -> dict[str, Any]:
    """Runs the child with these catalogs; its JSON answer (the child's output on failure)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argument = json.dumps(
        {"catalog": settings.model_dump_json(), "more_catalogs": [m.model_dump_json() for m in more], **spec}
    )
    proc = subprocess.run(
        [sys.executable, str(CHILD), argument],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, f"Spark child failed:\n{proc.stderr[-6000:]}"
    answer: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer


ORDERS_BEFORE_COUPON = 70
"""Orders without ``coupon``: more than the first micro-batch can take, so the table is created
without the column and evolves when the later orders bring it."""
ORDERS_WITH_COUPON = 30
MAX_OFFSETS_PER_TRIGGER = 60
CHANGE_EVENTS = 200
Row = list[Any]


@dataclass(frozen=True)
class RestSink:
    """One app run on the REST catalog + S3, and the rows its two tables must hold."""

    sink: SinkUnderTest
    orders: str
    customers: str
    orders_model: list[Row]
    traffic: ChangeTraffic


def _order(i: int) -> dict[str, Any]:
    """An order of one of four days; the later ones carry a ``coupon`` the first ones lack."""
    order = {
        "kind": "order",
        "id": i,
        "ts": f"2026-03-0{1 + i % 4}T{i % 24:02d}:15:00Z",
        "cents": 100 * i + 7,
    }
    if i >= ORDERS_BEFORE_COUPON:
        order["coupon"] = f"C{i % 3}"
    return order


def _order_row(order: dict[str, Any]) -> Row:
    micros = int(dt.datetime.fromisoformat(order["ts"]).timestamp()) * 1_000_000
    return [order["id"], micros, order["cents"], order.get("coupon")]


ORDER_COLUMNS = "id, unix_micros(ts), cents, coupon"
CUSTOMER_COLUMNS = "id, name, email, country, status, CAST(amount AS STRING), points, unix_micros(updated_at)"
"""What Spark SQL selects: timestamps as epoch microseconds and decimals as text, so both readers'
rows compare as plain JSON values."""


def _customer_rows(table: pa.Table) -> list[Row]:
    """Rows of the change table (or its model) as ``CUSTOMER_COLUMNS`` shows them."""
    table = table.sort_by("id")
    columns = [table[name].to_pylist() for name in ("id", "name", "email", "country", "status")]
    columns.append([None if v is None else str(v) for v in table["amount"].to_pylist()])
    columns.append(table["points"].to_pylist())
    columns.append(pc.cast(table["updated_at"], pa.int64()).to_pylist())
    return [list(row) for row in zip(*columns, strict=True)]


def _order_rows(table: pa.Table) -> list[Row]:
    """Rows of the orders table as ``ORDER_COLUMNS`` shows them."""
    table = table.sort_by("id")
    micros = pc.cast(table["ts"], pa.int64()).to_pylist()
    columns = [table["id"].to_pylist(), micros, table["cents"].to_pylist(), table["coupon"].to_pylist()]
    return [list(row) for row in zip(*columns, strict=True)]


@pytest.fixture(scope="module")
def rest_sink(
    object_store: ObjectStoreState,
    rest_catalog_server: RestCatalogState,
    bootstrap_servers: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> RestSink:
    """The real app, once, on the REST catalog + S3: orders into a table it auto-creates partitioned
    by ``day(ts)`` and evolves, Debezium changes into a change table (created beforehand with the
    source's rows, as a replica starts from a snapshot)."""
    settings = rest_s3_settings(rest_catalog_server, object_store)
    namespace = settings.name
    orders, customers = f"{namespace}.orders", f"{namespace}.customers"
    sink = new_sink(
        bootstrap_servers,
        tmp_path_factory.mktemp("rest-sink"),
        settings,
        partitions={"orders": 1, "customers": 2},
        prefix="rest",
        overrides={
            "tables": {
                orders: {"when": "kind == 'order'", "partition-by": ["day(ts)"], "evolution": True},
                customers: ROUTE,
            },
            "dynamic": None,
            "maintenance": {"min-input-files": 2, "orphan-older-than": "1d"},
        },
    )
    traffic = change_traffic(sink.topics["customers"], CHANGE_EVENTS, seed=5)
    create_table(sink.catalog, traffic.initial, customers)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5})
    placed = [_order(i) for i in range(ORDERS_BEFORE_COUPON + ORDERS_WITH_COUPON)]
    for order in placed:
        producer.produce(sink.topics["orders"], value=json.dumps(order).encode())
    for key, value in zip(traffic.keys, traffic.values, strict=True):
        producer.produce(traffic.topic, key=key, value=value)
    assert producer.flush(60) == 0
    log = sink.run("--available-now", "--max-offsets-per-trigger", str(MAX_OFFSETS_PER_TRIGGER))
    assert log.count(" committed (") >= 2, log[-3000:]
    return RestSink(sink, orders, customers, sorted(_order_row(o) for o in placed), traffic)


@dataclass(frozen=True)
class SharedRun:
    """What one Spark child did on the three catalogs, the checkpoint and the REST sink's tables (one
    JVM start, not five)."""

    catalogs: dict[str, CatalogSettings]
    namespace: str
    sql: dict[str, list[list[list[Any]]]]
    """Rows per statement, by catalog kind (``sink``: the REST sink's two tables, after maintenance)."""
    stream: dict[str, Any]
    topic: str
    checkpoint: str
    maintained: dict[str, dict[str, Any]]
    """What maintenance did to each of the REST sink's tables."""


@pytest.fixture(scope="module")
def shared_run(
    object_store: ObjectStoreState,
    rest_catalog_server: RestCatalogState,
    postgres_server: PostgresState,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
    rest_sink: RestSink,
) -> SharedRun:
    """PyIceberg writes a table in each catalog; then one Spark child reads them, creates and writes
    tables in each, runs Spark's Kafka source with its checkpoint on ``s3a://``, and maintains and
    reads the REST sink's tables."""
    catalogs = {
        "rest": rest_s3_settings(rest_catalog_server, object_store),
        "postgres": postgres_s3_settings(postgres_server, object_store),
        "sqlite": sqlite_s3_settings(object_store, tmp_path_factory.mktemp("sqlite-s3")),
    }
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    for settings in catalogs.values():
        catalog = load_catalog(settings)
        catalog.create_namespace(namespace)
        written = catalog.create_table(f"{namespace}.by_pyiceberg", schema=SCHEMA)
        written.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", None]}, schema=SCHEMA))
        assert written.location().startswith("s3://")
    topic = make_topic("ckpt", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for i in range(8):
        producer.produce(topic, value=b"x", partition=0 if i < 5 else 1)
    assert producer.flush(30) == 0
    checkpoint = fresh_s3_prefix().replace("s3://", "s3a://", 1) + "/checkpoints/sink"
    statements = [
        (kind, statement)
        for kind, settings in catalogs.items()
        for statement in (
            f"SELECT id, name FROM {settings.name}.{namespace}.by_pyiceberg ORDER BY id",
            f"CREATE TABLE {settings.name}.{namespace}.by_spark (id BIGINT, name STRING) USING iceberg",
            f"INSERT INTO {settings.name}.{namespace}.by_spark VALUES (10, 'x'), (11, 'y')",
            f"INSERT INTO {settings.name}.{namespace}.by_pyiceberg VALUES (4, 'd')",
        )
    ]
    sink_catalog = rest_sink.sink.settings.name
    statements += [
        ("sink", f"SELECT {ORDER_COLUMNS} FROM {sink_catalog}.{rest_sink.orders} ORDER BY id"),
        ("sink", f"SELECT {CUSTOMER_COLUMNS} FROM {sink_catalog}.{rest_sink.customers} ORDER BY id"),
    ]
    answer = run_spark(
        catalogs["sqlite"],
        catalogs["rest"],
        catalogs["postgres"],
        rest_sink.sink.settings,
        sql=[statement for _, statement in statements],
        stream={"bootstrap": bootstrap_servers, "topic": topic, "checkpoint": checkpoint},
        maintain=str(rest_sink.sink.config_file),
    )
    sql: dict[str, list[list[list[Any]]]] = {kind: [] for kind in [*catalogs, "sink"]}
    for (kind, _), rows in zip(statements, answer["sql"], strict=True):
        sql[kind].append(rows)
    maintained = {result["table"]: result for result in answer["maintain"]}
    return SharedRun(catalogs, namespace, sql, answer["stream"], topic, checkpoint, maintained)


@pytest.mark.parametrize("kind", ["rest", "postgres", "sqlite"])
def test_spark_and_pyiceberg_share_tables_on_s3(shared_run: SharedRun, kind: str) -> None:
    catalog = load_catalog(shared_run.catalogs[kind])
    namespace = shared_run.namespace

    assert shared_run.sql[kind][0] == [[1, "a"], [2, "b"], [3, None]]
    by_spark = catalog.load_table(f"{namespace}.by_spark")
    assert by_spark.location().startswith("s3://")
    assert sorted(by_spark.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 10, "name": "x"},
        {"id": 11, "name": "y"},
    ]
    assert sorted(catalog.load_table(f"{namespace}.by_pyiceberg").scan().to_arrow()["id"].to_pylist()) == [
        1,
        2,
        3,
        4,
    ]


def test_planner_reads_and_moves_an_s3a_checkpoint(
    shared_run: SharedRun, object_store: ObjectStoreState
) -> None:
    topic, checkpoint, answer = shared_run.topic, shared_run.checkpoint, shared_run.stream

    assert answer["ends"] == [[topic, 0, 5], [topic, 1, 3]]
    assert answer["ranges"] == [[topic, 0, 0, 5], [topic, 1, 0, 3]]
    assert answer["files_left_after_move"] == []
    store = object_store.filesystem()
    folder = checkpoint[len("s3a://") :].rsplit("/", 1)[0]
    # Folders that hold files: S3Proxy may keep the moved folder's empty entry (`sink`) under load.
    listing = store.get_file_info(fs.FileSelector(folder, recursive=True))
    moved = sorted({i.path[len(folder) + 1 :].split("/")[0] for i in listing if i.type == fs.FileType.File})
    assert len(moved) == 1 and moved[0].startswith("sink.stale-"), moved
    offsets = store.open_input_stream(f"{folder}/{moved[0]}/offsets/0").read().decode()
    assert json.loads(offsets.strip().splitlines()[-1]) == {topic: {"0": 5, "1": 3}}


def test_on_rest_and_s3_the_sink_auto_creates_a_partitioned_table_and_evolves_it(
    rest_sink: RestSink, shared_run: SharedRun
) -> None:
    table = rest_sink.sink.catalog.load_table(rest_sink.orders)

    assert [(field.name, str(field.transform)) for field in table.spec().fields] == [("ts_day", "day")]
    first, *later = table.metadata.schemas
    assert "coupon" not in first.column_names and later, "created without coupon, evolved afterwards"
    assert table.schema().find_field("coupon").field_type == StringType()
    pyiceberg_rows = _order_rows(table.scan().to_arrow())
    assert pyiceberg_rows == rest_sink.orders_model
    assert shared_run.sql["sink"][0] == pyiceberg_rows, "Spark SQL reads the same rows"
    compaction = shared_run.maintained[rest_sink.orders]["steps"]["compact"]
    assert compaction[0] == "ran", compaction


def test_on_rest_and_s3_a_debezium_stream_and_maintenance_leave_each_key_in_its_last_state(
    rest_sink: RestSink, shared_run: SharedRun
) -> None:
    table = rest_sink.sink.catalog.load_table(rest_sink.customers)

    model = _customer_rows(rest_sink.traffic.model)
    pyiceberg_rows = _customer_rows(table.scan().to_arrow())
    assert pyiceberg_rows == model
    assert shared_run.sql["sink"][1] == pyiceberg_rows, "Spark SQL reads the same rows"
    maintained = shared_run.maintained[rest_sink.customers]
    assert maintained["before"]["delete_files"] > 0, "the sink applied the changes as position deletes"
    assert maintained["after"]["delete_files"] == 0, maintained["steps"]
    assert all(action != "failed" for action, _ in maintained["steps"].values()), maintained["steps"]


@pytest.mark.parametrize(("kind", "output"), [("rest", "json"), ("postgres", "csv")])
def test_sql_command_prints_the_rows_pyiceberg_reads(
    shared_run: SharedRun, kind: str, output: str, tmp_path: Path
) -> None:
    """``fanout-sink sql -e`` on a sink YAML naming the catalog: its own JVM, the app's jars (the
    object-store set) and catalog settings; the embedded SQLite case is in tests/e2e/test_sql_cli.py."""
    settings = shared_run.catalogs[kind]
    identifier = f"{shared_run.namespace}.by_pyiceberg"
    config = write_sql_config(tmp_path, settings)

    done = run_sql_cli("--config", str(config), "--format", output, "-e",
                       f"SELECT * FROM {identifier} ORDER BY id")  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    expected = pyiceberg_rows(settings, identifier, "id")
    assert len(expected) == 4
    if output == "json":
        assert [json.loads(line) for line in done.stdout.splitlines()] == expected
    else:
        header, *rows = csv.reader(io.StringIO(done.stdout))
        assert header == list(expected[0])
        assert rows == [["" if value is None else str(value) for value in row.values()] for row in expected]
