"""The control topic on the real broker: created with one partition, read_committed, sinks kept apart."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from fanout_sink.errors import TopicError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, recovery
from fanout_sink.protocol import events as ev


def test_control_topic_is_created_with_one_partition_and_checked(
    bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    conf = {"bootstrap.servers": bootstrap_servers}
    name = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(channel.SinkChannel("test", conf, name))
    channel.ensure_control_topic(channel.SinkChannel("test", conf, name))  # present and fine: no error
    wide = make_topic("control-wide", partitions=3)
    with pytest.raises(TopicError, match=r"has 3 partitions.*exactly 1"):
        channel.ensure_control_topic(channel.SinkChannel("test", conf, wide))


def test_reader_sees_only_committed_events_of_its_own_sink(bootstrap_servers: str) -> None:
    conf = {"bootstrap.servers": bootstrap_servers}
    topic = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(channel.SinkChannel("test", conf, topic))
    mine = TransactionalProducer(KafkaClientFactory(conf), f"txn-mine-{topic}", "mine was fenced")
    other = TransactionalProducer(KafkaClientFactory(conf), f"txn-other-{topic}", "other was fenced")

    with mine.transaction():
        channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="kept-1"))
    with other.transaction():
        channel.produce_event(other, topic, "other", ev.StartCommit(commit_id="other-sink"))
    with pytest.raises(RuntimeError, match="abandoned"), mine.transaction():
        channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="aborted"))
        mine.flush(10)
        raise RuntimeError("abandoned: the envelope aborts the transaction")
    assert mine.usable, "an aborted transaction leaves the producer usable"

    # An open transaction holds the last stable offset back: its event is not readable yet.
    mine.begin()
    channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="kept-2"))
    mine.flush(10)
    reader = channel.ControlReader(channel.SinkChannel("mine", conf, topic))
    recovery.seek_to_low_watermark(reader)
    stable = reader.end_offset()
    seen = [e.event.payload for e in reader.read_until(stable)]
    assert [p.commit_id for p in seen if isinstance(p, ev.StartCommit)] == ["kept-1"]

    mine.commit()
    end = reader.end_offset()
    assert end > stable
    later = [e.event.payload for e in reader.read_until(end)]
    assert [p.commit_id for p in later if isinstance(p, ev.StartCommit)] == ["kept-2"]
    reader.close()


class _LeaderNotYetThere:
    """The reader's real consumer, whose first watermark requests get the answer a just-created
    topic gets while its leader is being elected on a busy broker."""

    def __init__(self, consumer: Any, refusals: int) -> None:
        self._consumer = consumer
        self.refusals = refusals

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return self._consumer.get_watermark_offsets(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_watermarks_wait_out_a_new_control_topics_leader_election(
    bootstrap_servers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen at start on a broker carrying 10,000 partitions: the app created its control topic and
    its first watermark request was refused with NOT_LEADER_FOR_PARTITION, which stopped the app."""
    conf = {"bootstrap.servers": bootstrap_servers}
    topic = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(channel.SinkChannel("test", conf, topic))
    reader = channel.ControlReader(channel.SinkChannel("test", conf, topic))
    refusing = _LeaderNotYetThere(reader._consumer, refusals=3)
    monkeypatch.setattr(reader, "_consumer", refusing)
    assert reader.watermarks() == (0, 0)
    assert refusing.refusals == 0
