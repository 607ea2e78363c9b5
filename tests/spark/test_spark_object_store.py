"""Spark on the object store, configured only by the ``catalog:`` section PyIceberg takes.

Spark runs in a child process (``support/spark_s3_child.py``) because a process has one
SparkContext and the suite's shared one starts without the object-store jars; one child serves the
whole module (three catalogs and the checkpoint), because each JVM start costs ~20 s. Each test checks
both directions through the real servers: PyIceberg writes and Spark SQL (Iceberg's S3FileIO, AWS
SDK v2) reads, Spark writes and PyIceberg (pyarrow's S3 filesystem) reads; and the planner reads a
real ``s3a://`` checkpoint that Spark's Kafka source wrote (Hadoop's S3A, same SDK).
"""

from __future__ import annotations

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
import pytest
from confluent_kafka import Producer
from pyarrow import fs
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


@dataclass(frozen=True)
class SharedRun:
    """What one Spark child did on the three catalogs and the checkpoint (one JVM start, not four)."""

    catalogs: dict[str, CatalogSettings]
    namespace: str
    sql: dict[str, list[list[list[Any]]]]
    stream: dict[str, Any]
    topic: str
    checkpoint: str


@pytest.fixture(scope="module")
def shared_run(
    object_store: ObjectStoreState,
    rest_catalog_server: RestCatalogState,
    postgres_server: PostgresState,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> SharedRun:
    """PyIceberg writes a table in each catalog; then one Spark child reads them, creates and writes
    tables in each, and runs Spark's Kafka source with its checkpoint on ``s3a://``."""
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
    answer = run_spark(
        catalogs["sqlite"],
        catalogs["rest"],
        catalogs["postgres"],
        sql=[statement for _, statement in statements],
        stream={"bootstrap": bootstrap_servers, "topic": topic, "checkpoint": checkpoint},
    )
    sql: dict[str, list[list[list[Any]]]] = {kind: [] for kind in catalogs}
    for (kind, _), rows in zip(statements, answer["sql"], strict=True):
        sql[kind].append(rows)
    return SharedRun(catalogs, namespace, sql, answer["stream"], topic, checkpoint)


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
    moved = [info.base_name for info in store.get_file_info(fs.FileSelector(folder))]
    assert len(moved) == 1 and moved[0].startswith("sink.stale-"), moved
    offsets = store.open_input_stream(f"{folder}/{moved[0]}/offsets/0").read().decode()
    assert json.loads(offsets.strip().splitlines()[-1]) == {topic: {"0": 5, "1": 3}}
