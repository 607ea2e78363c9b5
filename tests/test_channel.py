"""The control topic on the real broker: created with one partition, read_committed, sinks kept apart."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from fanout_sink import channel
from fanout_sink import events as ev
from fanout_sink.errors import TopicError

pytestmark = pytest.mark.kafka


def test_control_topic_is_created_with_one_partition_and_checked(
    bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    conf = {"bootstrap.servers": bootstrap_servers}
    name = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(conf, name)
    channel.ensure_control_topic(conf, name)  # present and fine: no error
    wide = make_topic("control-wide", partitions=3)
    with pytest.raises(TopicError, match=r"has 3 partitions.*exactly 1"):
        channel.ensure_control_topic(conf, wide)


def test_reader_sees_only_committed_events_of_its_own_sink(bootstrap_servers: str) -> None:
    conf = {"bootstrap.servers": bootstrap_servers}
    topic = f"control-{uuid.uuid4().hex[:8]}"
    channel.ensure_control_topic(conf, topic)
    mine = channel.transactional_producer(conf, f"txn-mine-{topic}")
    other = channel.transactional_producer(conf, f"txn-other-{topic}")

    mine.begin_transaction()
    channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="kept-1"))
    mine.commit_transaction(30)
    other.begin_transaction()
    channel.produce_event(other, topic, "other", ev.StartCommit(commit_id="other-sink"))
    other.commit_transaction(30)
    mine.begin_transaction()
    channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="aborted"))
    mine.flush(10)
    mine.abort_transaction(30)

    # An open transaction holds the last stable offset back: its event is not readable yet.
    mine.begin_transaction()
    channel.produce_event(mine, topic, "mine", ev.StartCommit(commit_id="kept-2"))
    mine.flush(10)
    reader = channel.ControlReader("mine", conf, topic)
    reader.seek_to_committed()
    stable = reader.end_offset()
    seen = [e.event.payload for e in reader.read_until(stable)]
    assert [p.commit_id for p in seen if isinstance(p, ev.StartCommit)] == ["kept-1"]

    mine.commit_transaction(30)
    end = reader.end_offset()
    assert end > stable
    later = [e.event.payload for e in reader.read_until(end)]
    assert [p.commit_id for p in later if isinstance(p, ev.StartCommit)] == ["kept-2"]
    reader.close()
