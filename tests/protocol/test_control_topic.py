"""The control topic over a long life, on the real broker and catalog: reads that fail mid-round,
retention and deleted records, and the topic's own settings."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType
from support.common import produce_json, read_slice, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.config.topics import ControlSettings, DeadLetterSettings
from fanout_sink.errors import ControlTopicError, TopicError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.topics import ensure_topic
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, recovery
from fanout_sink.protocol import events as ev


def _coordinator_watermark(sink: SinkUnderTest) -> int | None:
    holder = Consumer({**sink.kafka, "group.id": sink.channel.coordinator_group})
    try:
        offset = holder.committed([TopicPartition(sink.control_topic, 0)], timeout=30)[0].offset
    finally:
        holder.close()
    return int(offset) if offset >= 0 else None


def _table_of(i: int) -> str:
    return "abc"[(i // 3) % 3]


def _sink(sink_factory: SinkFactory) -> SinkUnderTest:
    """A sink of one source topic with three partitions, and tables a, b and c."""
    return sink_factory(partitions={"src": 3}, tables="abc", prefix="s")


def _deliver(sink: SinkUnderTest, ids: range) -> None:
    """Id ``i`` goes to source partition ``i % 3`` and table ``_table_of(i)``; one worker batch, so
    one transaction per partition with a ``DataWritten`` for each of the three tables."""
    for partition in range(3):
        values = [{"id": i, "table": _table_of(i)} for i in ids if i % 3 == partition]
        produce_json(sink.bootstrap, sink.topic, partition, values)
    sink.batch()


def test_a_control_read_failing_mid_round_keeps_the_events_it_already_read(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """Real: broker, control topic, worker transactions, SQLite catalog. Simulated: the consumer
    error, raised once by the ``control.before-poll`` fault point after some control events were
    handed out (what a broker going away between two fetches looks like to the reader)."""
    sink = _sink(sink_factory)
    coordinator = sink.coordinator()
    _deliver(sink, range(30))
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
    assert _coordinator_watermark(sink) is None  # the failed round acknowledged nothing

    result = coordinator.commit_round()
    coordinator.close()
    assert {t: o.outcome for t, o in result.tables.items()} == {f"sink.{t}": "committed" for t in "abc"}
    for name in "abc":
        assert table_ids(catalog, name) == [i for i in range(30) if _table_of(i) == name]
    assert _coordinator_watermark(sink) == result.round_end


def _delete_before(bootstrap: str, topic: str, offset: int) -> None:
    """Real deletion: what retention does to old segments, done now with delete-records."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic, 0, offset)])[TopicPartition(topic, 0, offset)].result(30)


def test_deleted_control_events_a_table_still_needs_stop_the_coordinator(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Real: broker, control topic, AdminClient.delete_records past the coordinator's committed low
    watermark (standing in for retention after a long outage), catalog. Nothing simulated."""
    sink = _sink(sink_factory)
    coordinator = sink.coordinator()
    _deliver(sink, range(30))
    watermark = coordinator.commit_round().low_watermark
    _deliver(sink, range(30, 60))  # pending: never committed
    coordinator.close()
    _delete_before(bootstrap_servers, sink.control_topic, watermark + 2)

    restarted = sink.coordinator(opened=False)
    with pytest.raises(
        ControlTopicError, match=rf"needs events from offset {watermark} on.*starts at offset {watermark + 2}"
    ):
        restarted.open()
    restarted.close()

    # Accepting the loss deliberately, as the error's fix says: the coordinator group moves to the log start.
    holder = Consumer({**sink.kafka, "group.id": sink.channel.coordinator_group})
    holder.commit(offsets=[TopicPartition(sink.control_topic, 0, watermark + 2)], asynchronous=False)
    holder.close()
    accepted = sink.coordinator()
    accepted.commit_round()
    accepted.close()
    assert table_ids(catalog, "a")[: len([i for i in range(30) if _table_of(i) == "a"])] == [
        i for i in range(30) if _table_of(i) == "a"
    ]


def test_an_expired_coordinator_group_resumes_from_the_low_watermark_its_last_round_recorded(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Real: broker, catalog, delete-records of acknowledged events only (what retention does on a
    healthy sink). Simulated: the coordinator group's offset expiring after a long downtime is done by
    deleting the group, which is what the broker's expiry leaves behind (a group without offsets)."""
    sink = _sink(sink_factory)
    coordinator = sink.coordinator()
    _deliver(sink, range(30))
    watermark = coordinator.commit_round().low_watermark
    coordinator.close()
    _deliver(sink, range(30, 60))  # while the app is down
    _delete_before(bootstrap_servers, sink.control_topic, watermark)
    admin = AdminClient(sink.kafka)
    for future in admin.delete_consumer_groups([sink.channel.coordinator_group]).values():
        future.result(30)
    assert _coordinator_watermark(sink) is None

    restarted = sink.coordinator()  # before: ControlTopicError ("acknowledged nothing ... log now starts at")
    restarted.commit_round()
    restarted.close()
    for name in "abc":
        assert table_ids(catalog, name) == [i for i in range(60) if _table_of(i) == name]


def test_the_reader_never_jumps_over_deleted_events(bootstrap_servers: str) -> None:
    """Real: broker and delete-records. A reader with nothing acknowledged, or positioned below the
    new log start, must stop with an error naming the offsets instead of resetting to the log start."""
    conf = {"bootstrap.servers": bootstrap_servers}
    sink = f"s{uuid.uuid4().hex[:6]}"
    control = f"{sink}-control"
    channel.ensure_control_topic(channel.SinkChannel(sink, conf, control))
    producer = TransactionalProducer(KafkaClientFactory(conf), f"txn-{control}", "fenced")
    for n in range(3):
        with producer.transaction():
            channel.produce_event(producer, control, sink, ev.StartCommit(commit_id=str(n)))
    _delete_before(bootstrap_servers, control, 2)

    fresh = channel.ControlReader(channel.SinkChannel(sink, conf, control))
    with pytest.raises(ControlTopicError, match=r"acknowledged nothing.*starts at offset 2"):
        recovery.seek_to_low_watermark(fresh)
    fresh.seek(0)  # e.g. a reader whose position was deleted under it
    with pytest.raises(ControlTopicError, match=r"needs events from offset 0 on.*starts at offset 2"):
        list(fresh.read_until(fresh.end_offset(), timeout_s=10))
    fresh.close()

    # A control topic recreated under the sink (simulated: the group acknowledged past its end).
    holder = Consumer({**conf, "group.id": channel.coordinator_group(sink)})
    holder.commit(offsets=[TopicPartition(control, 0, 100)], asynchronous=False)
    holder.close()
    recreated = channel.ControlReader(channel.SinkChannel(sink, conf, control))
    with pytest.raises(TopicError, match=r"ends at offset \d+, below offset 100 .* deleted and recreated"):
        recovery.seek_to_low_watermark(recreated)
    recreated.close()


def _topic_config(bootstrap: str, topic: str) -> dict[str, tuple[str, ConfigSource]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: (entry.value, ConfigSource(entry.source)) for name, entry in entries.items()}


def test_the_sink_creates_its_topics_to_keep_events_and_as_durable_as_the_offsets(
    bootstrap_servers: str,
) -> None:
    """Real: the single-node broker (offsets.topic.replication.factor and
    transaction.state.log.min.isr 1). The created topics carry their settings as topic configs,
    not as whatever the broker's defaults happen to be."""
    conf = {"bootstrap.servers": bootstrap_servers}
    control = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(channel.SinkChannel("test", conf, control))
    config = _topic_config(bootstrap_servers, control)
    deliberate = {
        k: config[k] for k in ("cleanup.policy", "retention.ms", "retention.bytes", "min.insync.replicas")
    }
    topic_level = ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert deliberate == {
        "cleanup.policy": ("delete", topic_level),
        "retention.ms": ("604800000", topic_level),  # 7 days: a restart reads only the tail
        "retention.bytes": ("-1", topic_level),
        "min.insync.replicas": ("1", topic_level),
    }
    dlq = f"dlq-{uuid.uuid4().hex[:8]}"
    ensure_topic(
        KafkaClientFactory(conf), dlq, "dead-letter topic", DeadLetterSettings(topic=dlq).topic_settings()
    )
    assert _topic_config(bootstrap_servers, dlq)["min.insync.replicas"] == ("1", topic_level)


def test_existing_sink_topics_are_checked_at_start(
    bootstrap_servers: str, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Real: topics created by someone else on the broker, with weaker settings than the sink's."""
    conf = {"bootstrap.servers": bootstrap_servers}
    weak = make_topic("control-weak", config={"min.insync.replicas": "1"})
    wanted = ControlSettings(min_insync_replicas=2).topic_settings()
    with pytest.raises(
        TopicError, match=r"min.insync.replicas 1 < 2.*\n  fix: .*control.min-insync-replicas: 1"
    ):
        channel.ensure_control_topic(channel.SinkChannel("test", conf, weak), settings=wanted)
    dlq_wanted = DeadLetterSettings(topic=weak, min_insync_replicas=2).topic_settings()
    with pytest.raises(TopicError, match=r"dead-letter topic .*min.insync.replicas 1 < 2"):
        ensure_topic(KafkaClientFactory(conf), weak, "dead-letter topic", dlq_wanted)

    compacted = make_topic("control-compact", config={"cleanup.policy": "compact"})
    with pytest.raises(TopicError, match=r"cleanup.policy=compact.*\n  fix: .*cleanup.policy=delete"):
        channel.ensure_control_topic(
            channel.SinkChannel("test", conf, compacted), settings=ControlSettings().topic_settings()
        )

    hour = make_topic("control-hour", config={"retention.ms": "3600000"})
    with caplog.at_level(logging.INFO, logger="fanout_sink.protocol.channel"):
        channel.ensure_control_topic(
            channel.SinkChannel("test", conf, hour), settings=ControlSettings().topic_settings()
        )
    (shorter,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "retention.ms=3600000, less than configured (control.retention-ms=604800000)" in shorter.message
    caplog.clear()

    # A topic of an older sink keeps every event: it keeps working, and the log says how to bound it.
    forever = make_topic("control-forever", config={"retention.ms": "-1"})
    with caplog.at_level(logging.INFO, logger="fanout_sink.protocol.channel"):
        channel.ensure_control_topic(
            channel.SinkChannel("test", conf, forever), settings=ControlSettings().topic_settings()
        )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "keeps every event (retention.ms=-1)" in caplog.text and "retention.ms=604800000" in caplog.text


def test_vtts_is_known_again_right_after_a_coordinator_restart(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """Real: broker, worker transactions, coordinator processes' state lost by closing them (what
    a restarted driver starts from). Before, VTTS stayed unknown after a restart until every
    partition that was behind reported again, because reports below the low watermark are not
    re-read; the last round's ``CommitComplete`` (always at or above it) now carries what they said."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="s")
    topic, coordinator = sink.topic, sink.coordinator
    first = coordinator()
    for partition in range(2):
        produce_json(bootstrap_servers, topic, partition, [{"id": i, "table": "ab"[i % 2]} for i in range(4)])
    sink.batch()
    claimed = first.commit_round().vtts_ms
    first.close()
    assert claimed is not None

    restarted = coordinator()  # nothing new anywhere: the same claim
    assert restarted.commit_round().vtts_ms == claimed
    restarted.close()

    produce_json(bootstrap_servers, topic, 1, [{"id": 9, "table": "a"}])  # partition 1 is behind now
    delivered = read_slice(bootstrap_servers, topic, 1, 0, 4)
    newest = max(int(t.timestamp() * 1000) for t in delivered["timestamp"].to_pylist())
    again = coordinator()
    assert again.commit_round().vtts_ms == newest - 1  # its next record may tie the newest delivered
    again.close()
