"""The README's first command: real events through a real broker into Iceberg tables, shown two ways.

Until the streaming pipeline lands this runs the round trip directly: it produces sample events to
the local broker in a Kafka transaction, reads them back with ``read_committed`` through a consumer
group, appends them to one Iceberg table per topic, and shows the tables through PyIceberg and
through Spark SQL (Iceberg's JDBC catalog over the same SQLite file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.sample_data import shop_events
from fanout_sink.stack import daemon

TOPICS = {"orders": 3, "clicks": 2}
TABLES = ("orders", "payments", "clicks")  # one per event type
NAMESPACE = "demo"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ensure_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=30).topics)
    missing = [NewTopic(name, parts, 1) for name, parts in TOPICS.items() if name not in existing]
    for future in admin.create_topics(missing).values() if missing else []:
        future.result(timeout=30)


def _produce(bootstrap: str, records: int, start: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fanout-sink-demo-producer"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for event in shop_events(records, start=start):
        producer.produce(event.topic, key=event.key, value=event.value)
        producer.poll(0)
    producer.commit_transaction(60)


def _consume(bootstrap: str, topic: str) -> tuple[list[bytes], list[TopicPartition]]:
    """Every committed record of ``topic`` past the demo group's offsets, and the offsets to commit."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "fanout-sink-demo",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    at_eof: set[int] = set()
    positions: dict[int, int] = {}
    try:
        while len(at_eof) < TOPICS[topic]:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            value, partition, offset, error = msg.value(), msg.partition(), msg.offset(), msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                    at_eof.add(partition)
                    continue
                raise RuntimeError(f"reading {topic}: {error}")
            if value is not None and partition is not None and offset is not None:
                values.append(value)
                positions[partition] = offset + 1
        commits = [TopicPartition(topic, part, offset) for part, offset in positions.items()]
        if commits:
            consumer.commit(offsets=commits, asynchronous=False)
    finally:
        consumer.close()
    return values, commits


def _append(catalog: Any, name: str, records: list[dict[str, Any]], commits: list[TopicPartition]) -> None:
    rows = pa.Table.from_pylist(records)
    identifier = f"{NAMESPACE}.{name}"
    if not catalog.table_exists(identifier):
        catalog.create_namespace_if_not_exists(NAMESPACE)
        catalog.create_table(identifier, schema=rows.schema)
    table = catalog.load_table(identifier)
    offsets = ",".join(f"{tp.partition}:{tp.offset}" for tp in sorted(commits, key=lambda tp: tp.partition))
    table.append(
        rows.cast(table.schema().as_arrow()), snapshot_properties={"fanout-sink.demo.offsets": offsets}
    )


def run(work_dir: Path, records: int = 2000, bootstrap_servers: str | None = None) -> int:
    """Run the demo against ``bootstrap_servers``, or against the local stack (started when down)."""
    work_dir = work_dir.resolve()
    if bootstrap_servers is None:
        state, started = daemon.up(daemon.default_dir())
        bootstrap_servers = state.bootstrap_servers
        _say(f"Kafka broker {'started' if started else 'running'} at {bootstrap_servers}")
    _ensure_topics(bootstrap_servers)
    settings = CatalogSettings(
        name="lake",
        type="sql",
        uri=f"sqlite:///{work_dir / 'catalog.db'}",
        warehouse=f"file://{work_dir / 'warehouse'}",
    )
    catalog = load_catalog(settings)
    # Number this run's events after those already in the tables, so every run adds new ids.
    start = 0
    for name in TABLES:
        identifier = f"{NAMESPACE}.{name}"
        if catalog.table_exists(identifier):
            start += len(catalog.load_table(identifier).scan(selected_fields=("id",)).to_arrow())
    _say(f"producing {records} sample events to topics {', '.join(TOPICS)}")
    _produce(bootstrap_servers, records, start)
    for topic in TOPICS:
        values, commits = _consume(bootstrap_servers, topic)
        by_type: dict[str, list[dict[str, Any]]] = {}
        for value in values:  # interim: the streaming pipeline routes in Arrow, not per record
            record = json.loads(value)
            by_type.setdefault(f"{record['type']}s", []).append(record)
        for name, rows in by_type.items():
            _append(catalog, name, rows, commits)
            _say(f"{topic}: {len(rows)} new {name} appended to lake.{NAMESPACE}.{name}")

    print("\n== through PyIceberg ==")
    for name in TABLES:
        table = catalog.load_table(f"{NAMESPACE}.{name}")
        data = table.scan().to_arrow()
        print(f"lake.{NAMESPACE}.{name}: {data.num_rows} rows, {len(table.snapshots())} snapshots")
        print(data.select(["id", "ts"]).slice(0, 3).to_pandas().to_string(index=False))

    print("\n== through Spark SQL (Iceberg JDBC catalog on the same SQLite file) ==")
    from fanout_sink.spark_session import build_spark_session

    spark = build_spark_session(settings, app_name="fanout-sink-demo")
    try:
        orders = f"lake.{NAMESPACE}.orders"
        spark.sql(
            "SELECT customer.country, count(*) AS orders, round(sum(CAST(amount AS DOUBLE)), 2) AS revenue "
            f"FROM {orders} GROUP BY customer.country ORDER BY revenue DESC"
        ).show(5, truncate=False)
        spark.sql(
            f"SELECT page, count(*) AS clicks FROM lake.{NAMESPACE}.clicks GROUP BY page ORDER BY clicks DESC"
        ).show(5, truncate=False)
        spark.sql(
            "SELECT snapshot_id, summary['added-records'] AS added, "
            f"summary['fanout-sink.demo.offsets'] AS offsets FROM {orders}.snapshots ORDER BY committed_at"
        ).show(truncate=False)
    finally:
        spark.stop()
    print(f"Tables live in {work_dir}; query them with PyIceberg (catalog 'lake', uri {settings.uri}).")
    return 0
