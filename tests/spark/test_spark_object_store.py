"""Spark on the object store, configured only by the ``catalog:`` section PyIceberg takes.

Spark runs in a child process (``support/spark_s3_child.py``) because a process has one
SparkContext and the suite's shared one starts without the object-store jars. Each test checks
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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.object_store import ObjectStoreState

pytestmark = [pytest.mark.stores, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "spark_s3_child.py"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def run_spark(settings: CatalogSettings, **spec: Any) -> dict[str, Any]:
    """Runs the child with this catalog; its JSON answer (the child's output on failure)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argument = json.dumps({"catalog": settings.model_dump_json(), **spec})
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


@pytest.fixture
def sqlite_s3_catalog_settings(
    object_store: ObjectStoreState, s3_prefix: str, tmp_path: Path
) -> CatalogSettings:
    """The embedded SQL catalog with its warehouse on the object store."""
    return CatalogSettings(
        name=f"lake_{uuid.uuid4().hex[:8]}",
        type="sql",
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=s3_prefix,
        **object_store.pyiceberg_properties(),
    )


@pytest.mark.parametrize(
    "catalog_fixture",
    ["rest_s3_catalog_settings", "postgres_s3_catalog_settings", "sqlite_s3_catalog_settings"],
)
def test_spark_and_pyiceberg_share_tables_on_s3(catalog_fixture: str, request: pytest.FixtureRequest) -> None:
    settings: CatalogSettings = request.getfixturevalue(catalog_fixture)
    catalog = load_catalog(settings)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    written = catalog.create_table(f"{namespace}.by_pyiceberg", schema=SCHEMA)
    written.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", None]}, schema=SCHEMA))
    assert written.location().startswith("s3://")

    name = settings.name
    answer = run_spark(
        settings,
        sql=[
            f"SELECT id, name FROM {name}.{namespace}.by_pyiceberg ORDER BY id",
            f"CREATE TABLE {name}.{namespace}.by_spark (id BIGINT, name STRING) USING iceberg",
            f"INSERT INTO {name}.{namespace}.by_spark VALUES (10, 'x'), (11, 'y')",
            f"INSERT INTO {name}.{namespace}.by_pyiceberg VALUES (4, 'd')",
        ],
    )

    assert answer["sql"][0] == [[1, "a"], [2, "b"], [3, None]]
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


@pytest.mark.kafka
def test_planner_reads_and_moves_an_s3a_checkpoint(
    object_store: ObjectStoreState,
    s3_prefix: str,
    sqlite_s3_catalog_settings: CatalogSettings,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
) -> None:
    topic = make_topic("ckpt", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for i in range(8):
        producer.produce(topic, value=b"x", partition=0 if i < 5 else 1)
    assert producer.flush(30) == 0
    checkpoint = s3_prefix.replace("s3://", "s3a://", 1) + "/checkpoints/sink"

    answer = run_spark(
        sqlite_s3_catalog_settings,
        stream={"bootstrap": bootstrap_servers, "topic": topic, "checkpoint": checkpoint},
    )["stream"]

    assert answer["ends"] == [[topic, 0, 5], [topic, 1, 3]]
    assert answer["ranges"] == [[topic, 0, 0, 5], [topic, 1, 0, 3]]
    assert answer["exists_after_move"] is False
    store = object_store.filesystem()
    folder = checkpoint[len("s3a://") :].rsplit("/", 1)[0]
    from pyarrow import fs

    moved = [info.base_name for info in store.get_file_info(fs.FileSelector(folder))]
    assert len(moved) == 1 and moved[0].startswith("sink.stale-"), moved
    offsets = store.open_input_stream(f"{folder}/{moved[0]}/offsets/0").read().decode()
    assert json.loads(offsets.strip().splitlines()[-1]) == {topic: {"0": 5, "1": 3}}
