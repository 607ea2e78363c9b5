"""Test-side stand-ins for what other parts of the project do: a tiny processor and a tiny driver.

Shared by the in-process tests (imported as ``support.common``) and by the child-process scripts next
to this file (imported as ``common``), so that a killed child and the test agree on every name.

Source records are JSON ``{"id": <int>, "table": "<name>"}``; ``table`` routes to ``<ns>.<name>``,
``"skip"`` is filtered, anything that is not JSON is dead-lettered.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from fanout_sink.catalog import CatalogSettings, spark_catalog_conf
from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka import native_consume
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol import table_state
from fanout_sink.protocol.channel import SinkChannel, sink_group
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform.records import (
    RAW_RECORD_SCHEMA,
    DeadLetter,
    RoutedSlice,
    SliceProcessor,
    TableRows,
)

NAMESPACE = "sink"
TABLE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "topic", StringType(), required=False),
)
ARROW_SCHEMA = TABLE_SCHEMA.as_arrow()


def sink_channel(config: SinkConfig) -> SinkChannel:
    """A test sink's channel, the same in the test and in its children: packed as the app packs when
    ``spark.partition-groups`` is set, else one group per partition (what tests that deliver
    partitions one at a time from several processes need)."""
    return SinkChannel.from_config(config, PartitionGroups(config.spark.partition_groups))


def embedded_catalog_settings(folder: Path) -> CatalogSettings:
    """A fresh embedded catalog (SQLite + local warehouse) in ``folder``, under a name of its own.

    Spark caches a catalog per name for the session's life, so the shared session needs new names.
    """
    return CatalogSettings(
        name=f"lake_{uuid.uuid4().hex[:8]}",
        type="sql",
        uri=f"sqlite:///{folder / 'catalog.db'}",
        warehouse=f"file://{folder / 'warehouse'}",
    )


def register_spark_catalog(spark: Any, settings: CatalogSettings) -> str:
    """Register a catalog in a Spark session (the suite shares one) and return its name."""
    for key, value in spark_catalog_conf(settings).items():
        spark.conf.set(key, value)
    return settings.name


def create_topic(
    bootstrap: str, prefix: str, partitions: int = 1, config: Mapping[str, str] | None = None
) -> str:
    """Create a uniquely named topic and return its name."""
    return create_named_topic(bootstrap, f"{prefix}-{uuid.uuid4().hex[:8]}", partitions, config)


def create_named_topic(
    bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
) -> str:
    """Create the topic ``name`` (for names a ``source.pattern`` must match) and return it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until its future resolves
    admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))])[name].result(30)
    return name


def create_tables(catalog: Any, names: Iterable[str]) -> None:
    catalog.create_namespace_if_not_exists(NAMESPACE)
    for name in names:
        catalog.create_table(f"{NAMESPACE}.{name}", schema=TABLE_SCHEMA)


def make_processor(catalog: Any) -> SliceProcessor:
    """Routes by the ``table`` field; loads each table fresh per slice (like an executor would)."""

    def process(raw: pa.Table) -> RoutedSlice:
        routed = RoutedSlice()
        rows: dict[str, list[dict[str, Any]]] = {}
        for record in raw.to_pylist():
            try:
                value = json.loads(record["value"])
            except (ValueError, TypeError):
                reason = f"not JSON at {record['topic']}[{record['partition']}]@{record['offset']}"
                routed.dead_letters.append(
                    DeadLetter(record["key"], record["value"], [("fanout-sink.reason", reason.encode())])
                )
                continue
            if value["table"] == "skip":
                routed.filtered += 1
                continue
            rows.setdefault(f"{NAMESPACE}.{value['table']}", []).append(
                {"id": value["id"], "topic": record["topic"]}
            )
        for identifier, table_rows in rows.items():
            routed.tables[identifier] = TableRows(
                catalog.load_table(identifier), pa.Table.from_pylist(table_rows, schema=ARROW_SCHEMA)
            )
        return routed

    return process


def produce_json(
    bootstrap: str,
    topic: str,
    partition: int,
    values: Iterable[dict[str, Any] | bytes],
    txn_id: str | None = None,
) -> None:
    """Produce records to one partition (in one committed transaction when ``txn_id`` is given)."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if txn_id:
        conf["transactional.id"] = txn_id
    producer = Producer(conf)
    if txn_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    for value in values:
        data = value if isinstance(value, bytes) else json.dumps(value).encode()
        producer.produce(topic, value=data, partition=partition, timestamp=int(time.time() * 1000))
    if txn_id:
        producer.commit_transaction(30)
    producer.flush(30)


def end_offset(bootstrap: str, topic: str, partition: int) -> int:
    """The last stable offset of a source partition (what a planner would take as the batch end)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "planner", "isolation.level": "read_committed"}
    )
    try:
        return int(
            consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)[1]
        )
    finally:
        consumer.close()


def read_slice(bootstrap: str, topic: str, partition: int, start: int, end: int) -> pa.Table:
    """The visible records of ``[start, end)`` as a raw slice, like Spark's Kafka source delivers it."""
    rows: list[dict[str, Any]] = []
    if start < end:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "slice-reader",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, partition, start)])
        try:
            position = start
            deadline = time.monotonic() + 30
            while position < end and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        position = max(position, msg.offset())
                    continue
                position = msg.offset() + 1
                if msg.offset() >= end:
                    break
                rows.append(
                    {
                        "key": msg.key(),
                        "value": msg.value(),
                        "topic": topic,
                        "partition": partition,
                        "offset": msg.offset(),
                        "timestamp": dt.datetime.fromtimestamp(msg.timestamp()[1] / 1000, tz=dt.UTC),
                        "timestampType": msg.timestamp()[0],
                        "headers": [{"key": k, "value": v} for k, v in (msg.headers() or [])],
                    }
                )
        finally:
            consumer.close()
    return pa.Table.from_pylist(rows, schema=RAW_RECORD_SCHEMA)


def run_batch(
    worker: SliceWorker, bootstrap: str, topics: dict[str, int], process: SliceProcessor
) -> list[SliceResult]:
    """One micro-batch: per source partition, plan [sink group offset or 0, last stable offset) and commit."""
    # Planning reads the group without waiting for pending transactions (a dead attempt's open
    # transaction would block a stable read until it times out); Spark plans from its checkpoint.
    # Unlike Spark's batch (run_planned_batch), empty ranges are committed too: every partition
    # then has an offset, which VTTS and lag tests rely on.
    planner = GroupOffsets(worker.channel.clients, worker.channel.sink_group, stable=False)
    results = []
    for topic, partitions in topics.items():
        for partition in range(partitions):
            start = planner.committed([(topic, partition)])[(topic, partition)] or 0
            end = end_offset(bootstrap, topic, partition)
            raw = read_slice(bootstrap, topic, partition, start, end)
            results.append(worker.commit_slice(Slice(topic, partition, start, end), raw, process))
    planner.close()
    return results


def use_reader(kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Range readers made from now on in this test consume with ``kind``: ``native`` (skipped
    where the extension is not built; test_native_consume fails when it should have been) or
    ``python`` (forced with ``FANOUT_SINK_READER=python``, as an operator would)."""
    chooses = native_consume.native_module  # cached per process: uncached for the test
    if hasattr(chooses, "cache_clear"):
        chooses.cache_clear()
    monkeypatch.setattr(native_consume, "native_module", getattr(chooses, "__wrapped__", chooses))
    if kind == "python":
        monkeypatch.setenv(native_consume.READER_ENV, "python")
    else:
        monkeypatch.delenv(native_consume.READER_ENV, raising=False)
        module, line = native_consume.native_module()
        if module is None:
            pytest.skip(line)
    return kind


class CountedConsumer:
    """A real consumer that counts the calls which (re)start fetching (``assign``, ``unassign``,
    ``seek``): each makes a range read wait for a first fetch, so they are counted instead of timed."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.calls: dict[str, int] = {"assign": 0, "unassign": 0, "seek": 0}

    def __getattr__(self, name: str) -> Any:
        if name in self.calls:
            self.calls[name] += 1
        return getattr(self._consumer, name)


def run_planned_batch(
    worker: SliceWorker,
    bootstrap: str,
    ranges: dict[tuple[str, int], tuple[int, int]],
    process: SliceProcessor,
) -> list[SliceResult]:
    """Deliver planned ranges ``{(topic, partition): (start, end)}`` as Spark's batch does
    (``spark/batch.py``): a slice per partition whose range is not empty, packed into the worker's
    partition groups (one transaction per group), with the visible records of [start, end) read like
    the Kafka source."""
    slices = [Slice(t, p, start, end) for (t, p), (start, end) in sorted(ranges.items()) if end > start]
    results = []
    for group in worker.channel.partition_groups.pack(slices):
        work = [(s, read_slice(bootstrap, s.topic, s.partition, s.start, s.end)) for s in group]
        results += worker.commit_partition_group(work, process)
    return results


def table_ids(catalog: Any, name: str) -> list[int]:
    """Every id in a table, sorted, with duplicates kept (a duplicate must fail the comparison)."""
    table = catalog.load_table(f"{NAMESPACE}.{name}")
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def sink_group_offset(
    bootstrap: str, sink: str, topic: str, partition: int, stable: bool = True
) -> int | None:
    """The sink group's committed offset for one partition (``stable``: wait for pending transactions)."""
    clients = KafkaClientFactory({"bootstrap.servers": bootstrap})
    reader = GroupOffsets(clients, sink_group(sink), stable=stable)
    try:
        return reader.committed([(topic, partition)])[(topic, partition)]
    finally:
        reader.close()


def write_checkpoint_batch(
    root: Path,
    batch_id: int,
    ends: dict[str, dict[int, int]],
    starts: dict[str, dict[int, int]] | None = None,
    committed: bool = True,
) -> None:
    """Write batch ``batch_id`` of a Spark checkpoint as Spark 4's Kafka source and offset log do:
    ``sources/0/0`` (a NUL byte, ``v1`` and the first batch's start offsets; written with batch 0),
    ``offsets/<id>`` (``v1``, batch metadata, end offsets) and, when ``committed``, ``commits/<id>``."""

    def spec(offsets: dict[str, dict[int, int]]) -> str:
        return json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()})

    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(exist_ok=True)
    if not (root / "metadata").exists():
        (root / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    if batch_id == 0:
        (root / "sources" / "0").mkdir(parents=True, exist_ok=True)
        initial = starts or {t: dict.fromkeys(parts, 0) for t, parts in ends.items()}
        (root / "sources" / "0" / "0").write_text("\0v1\n" + spec(initial))
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    (root / "offsets" / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{spec(ends)}")
    if committed:
        commit_checkpoint_batch(root, batch_id)


def commit_checkpoint_batch(root: Path, batch_id: int) -> None:
    """Spark's mark that batch ``batch_id`` is done (``foreachBatch`` returned): ``commits/<id>``."""
    (root / "commits").mkdir(parents=True, exist_ok=True)
    (root / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def commit_as_round(
    catalog: Any, sink: str, name: str, commit_id: str, end: int, round_tables: int | None, ids: list[int]
) -> None:
    """Table ``sink.<name>``'s snapshot of round ``commit_id`` (ending at control offset ``end``), with
    the summary the coordinator writes (``round_tables`` None: a round that is no consistent point)."""
    properties = table_state.summary_properties(sink, {0: end}, commit_id, None)
    if round_tables is not None:
        properties.update(table_state.round_properties(sink, round_tables))
    rows = pa.Table.from_pylist([{"id": i, "topic": "t"} for i in ids], ARROW_SCHEMA)
    catalog.load_table(f"{NAMESPACE}.{name}").append(rows, snapshot_properties=properties)


def record_fsyncs(monkeypatch: Any) -> list[str]:
    """The paths ``os.fsync`` is called for from now on (it still syncs), in call order: durability
    cannot be observed without pulling the power, so tests count what was synced."""
    paths: list[str] = []
    real = os.fsync

    def recording_fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return paths
