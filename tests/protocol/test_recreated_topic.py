"""A source topic deleted and recreated under the same name while the sink was down (issue 24 item 1).

Real: the broker (it drops the sink group's offsets of the deleted topic and gives the new topic a
new topic id), workers' transactions, the control topic's ``DataComplete`` and ``CommitComplete``
events, the coordinator's rounds and the Iceberg table whose rows are counted. Simulated: Spark's
checkpoint (``support.common.write_checkpoint_batch``) and the restart, which is the start-up
planning (``planning.plan_start``) followed by the batch Spark would plan from its answer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from support.common import (
    end_offset,
    make_processor,
    produce_json,
    read_slice,
    table_ids,
    write_checkpoint_batch,
)
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.errors import TopicRecreatedError
from fanout_sink.kafka.topics import topic_ids
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import ControlReader
from fanout_sink.protocol.slices import Slice
from fanout_sink.spark import planning

OLD_ROWS, NEW_ROWS = 6, 3
"""The recreated topic gets fewer records than the old topic's delivered position."""


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again under the same name (the broker deletes asynchronously:
    the create is retried while the name is still taken)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _deliver_old_generation(sink: SinkUnderTest) -> str:
    """Deliver and commit ``OLD_ROWS`` records of the first topic; Spark's checkpoint agrees. Returns
    the old topic's id."""
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "a"} for i in range(OLD_ROWS)])
    worker = sink.worker()
    sink.deliver(worker, OLD_ROWS)
    worker.close()
    coordinator = sink.coordinator()
    coordinator.poll_once()
    coordinator.commit_round()
    coordinator.close()
    write_checkpoint_batch(sink.checkpoint, 0, {sink.topic: {0: OLD_ROWS}})
    return topic_ids(sink.channel.clients, [sink.topic])[sink.topic]


def _restart_and_continue(sink: SinkUnderTest) -> None:
    """The app restarts: start-up planning, then the batch Spark plans from its answer (the
    checkpoint's next batch, or the starting offsets when the checkpoint was moved aside), then a round."""
    starting = planning.plan_start(sink.config, sink.channel, {sink.topic: 1})
    end = end_offset(sink.bootstrap, sink.topic, 0)
    if (sink.checkpoint / "commits" / "0").exists():
        start = planning.last_committed_ends(str(sink.checkpoint)).get((sink.topic, 0), 0)  # type: ignore[union-attr]
    else:
        start = max(0, json.loads(starting)[sink.topic]["0"])  # -2 is earliest: 0 on a new topic
    if end > start:
        worker = sink.worker()
        raw = read_slice(sink.bootstrap, sink.topic, 0, start, end)
        worker.commit_slice(Slice(sink.topic, 0, start, end), raw, make_processor(sink.catalog))
        worker.close()
    coordinator = sink.coordinator()
    coordinator.poll_once()
    coordinator.commit_round()
    coordinator.close()


def test_a_recreated_topic_is_read_from_its_beginning(sink_factory: SinkFactory) -> None:
    """Delete and recreate the source topic while the sink is down, produce fewer records than the
    old position, restart: the new topic's rows all land (the default, ``earliest``), and the
    control topic records them under the new topic id."""
    sink = sink_factory(
        partitions={"src": 1}, prefix="rc", tables="a", source={"starting-offsets": "earliest"}
    )
    old_id = _deliver_old_generation(sink)
    recreate_topic(sink.bootstrap, sink.topic, 1)
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": 100 + i, "table": "a"} for i in range(NEW_ROWS)])
    new_id = topic_ids(sink.channel.clients, [sink.topic])[sink.topic]
    assert new_id != old_id

    _restart_and_continue(sink)

    assert table_ids(sink.catalog, "a") == [*range(OLD_ROWS), *range(100, 100 + NEW_ROWS)]
    assert sink.committed(sink.topic, 0) == NEW_ROWS
    reader = ControlReader(sink.channel)
    try:
        low, high = reader.watermarks()
        reader.seek(low)
        events = [item.event.payload for item in reader.read_until(high, 30)]
    finally:
        reader.close()
    completes = [e for e in events if isinstance(e, ev.DataComplete)]
    assert [(c.topic_id, c.next_offset) for c in completes] == [(old_id, OLD_ROWS), (new_id, NEW_ROWS)]
    last_round = [e for e in events if isinstance(e, ev.CommitComplete)][-1]
    assert last_round.topic_ids == {sink.topic: new_id}
    assert ev.delivered_positions(last_round) == {(sink.topic, 0): NEW_ROWS}


def test_a_recreated_topic_stops_the_sink_when_the_operator_says_fail(sink_factory: SinkFactory) -> None:
    """``source.recreated-topic-offsets: fail``: the restart stops with an error naming the topic and
    both ids; nothing is delivered and Spark's checkpoint is left as it was."""
    sink = sink_factory(
        partitions={"src": 1},
        prefix="rf",
        tables="a",
        source={"starting-offsets": "earliest", "recreated-topic-offsets": "fail"},
    )
    old_id = _deliver_old_generation(sink)
    recreate_topic(sink.bootstrap, sink.topic, 1)
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": 100 + i, "table": "a"} for i in range(NEW_ROWS)])
    new_id = topic_ids(sink.channel.clients, [sink.topic])[sink.topic]

    with pytest.raises(TopicRecreatedError) as raised:
        planning.plan_start(sink.config, sink.channel, {sink.topic: 1})

    message = str(raised.value)
    assert sink.topic in message and old_id in message and new_id in message
    assert "recreated-topic-offsets" in message
    assert (Path(sink.checkpoint) / "commits" / "0").exists()
    assert sink.committed(sink.topic, 0) is None


def test_a_worker_handed_the_old_topics_position_stops_instead_of_skipping(sink_factory: SinkFactory) -> None:
    """Spark kept running across the recreation and planned the new topic's records from the old
    position on: the worker must neither restore the old position (it would skip the new records
    below it) nor deliver the range (the records before it would be lost): it stops the batch."""
    sink = sink_factory(
        partitions={"src": 1}, prefix="rw", tables="a", source={"starting-offsets": "earliest"}
    )
    _deliver_old_generation(sink)
    recreate_topic(sink.bootstrap, sink.topic, 1)
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": 100 + i, "table": "a"} for i in range(OLD_ROWS + 2)])

    worker = sink.worker()
    try:
        raw = read_slice(sink.bootstrap, sink.topic, 0, OLD_ROWS, OLD_ROWS + 2)
        with pytest.raises(TopicRecreatedError, match="restart"):
            worker.commit_slice(
                Slice(sink.topic, 0, OLD_ROWS, OLD_ROWS + 2), raw, make_processor(sink.catalog)
            )
    finally:
        worker.close()
    assert sink.committed(sink.topic, 0) is None
    assert table_ids(sink.catalog, "a") == list(range(OLD_ROWS))
