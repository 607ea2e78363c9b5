"""The control topic over a long life, on the real broker and catalog: reads that fail mid-round,
retention and deleted records, and the topic's own settings."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from support.common import create_tables, make_processor, produce_json, run_batch, table_ids

from fanout_sink import faults
from fanout_sink.protocol import channel
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker

pytestmark = pytest.mark.kafka


def _coordinator_watermark(conf: dict[str, Any], sink: str, control: str) -> int | None:
    holder = Consumer({**conf, "group.id": channel.coordinator_group(sink)})
    try:
        offset = holder.committed([TopicPartition(control, 0)], timeout=30)[0].offset
    finally:
        holder.close()
    return int(offset) if offset >= 0 else None


def _table_of(i: int) -> str:
    return "abc"[(i // 3) % 3]


def _deliver(conf: dict[str, Any], sink: str, control: str, topic: str, catalog: Any, ids: range) -> None:
    """Id ``i`` goes to source partition ``i % 3`` and table ``_table_of(i)``; one worker batch, so
    one transaction per partition with a ``DataWritten`` for each of the three tables."""
    for partition in range(3):
        values = [{"id": i, "table": _table_of(i)} for i in ids if i % 3 == partition]
        produce_json(conf["bootstrap.servers"], topic, partition, values)
    worker = SliceWorker(sink, conf, control)
    run_batch(worker, conf["bootstrap.servers"], {topic: 3}, make_processor(catalog))
    worker.close()


def test_a_control_read_failing_mid_round_keeps_the_events_it_already_read(
    bootstrap_servers: str, make_topic: Callable[..., str], catalog: Any
) -> None:
    """Real: broker, control topic, worker transactions, SQLite catalog. Simulated: the consumer
    error, raised once by the ``control.before-poll`` fault point after some control events were
    handed out (what a broker going away between two fetches looks like to the reader)."""
    sink = f"s{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": bootstrap_servers}
    control = f"{sink}-control"
    topic = make_topic("src", partitions=3)
    create_tables(catalog, "abc")
    coordinator = Coordinator(sink, conf, control, catalog, source_topics=[topic])
    coordinator.open()
    _deliver(conf, sink, control, topic, catalog, range(30))
    # Three worker transactions: DataWritten a/b/c + DataComplete + a marker each.
    assert coordinator._reader is not None and coordinator._reader.end_offset() == 3 * 5

    failed: list[int] = []

    def broker_goes_away(position: int) -> None:
        if not failed and position >= 8:  # one transaction and part of the next were read
            failed.append(position)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "simulated: broker went away"))

    with faults.register("control.before-poll", broker_goes_away), pytest.raises(KafkaException):
        coordinator.commit_round()
    assert failed
    assert _coordinator_watermark(conf, sink, control) is None  # the failed round acknowledged nothing

    result = coordinator.commit_round()
    coordinator.close()
    assert {t: o.outcome for t, o in result.tables.items()} == {f"sink.{t}": "committed" for t in "abc"}
    for name in "abc":
        assert table_ids(catalog, name) == [i for i in range(30) if _table_of(i) == name]
    assert _coordinator_watermark(conf, sink, control) == result.round_end
