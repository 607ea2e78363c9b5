"""A control topic that does not grow forever: start-up reads a bounded tail, and a restart after the
topic's retention deleted its history (even all of it) recovers exactly or stops, never guesses.

Real: the broker, workers' and coordinators' transactions, the catalog, children SIGKILLed at named
fault points, and ``AdminClient.delete_records``, which moves the log start exactly as retention
does when it deletes expired segments (a log whose every record is older than ``retention.ms``
loses all its segments, the active one too: the broker rolls a new one first). Simulated: only
when the deletion strikes, and the sink group's and coordinator group's offsets expiring, done by
deleting the groups (what the broker's expiry leaves behind: a group without offsets).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, control_tail, recovery
from fanout_sink.protocol import events as ev


def _delete_groups(sink: SinkUnderTest, *groups: str) -> None:
    admin = AdminClient(sink.kafka)
    for group in groups:
        admin.delete_consumer_groups([group], request_timeout=60)[group].result(120)


def _cut_log_at(sink: SinkUnderTest, offset: int | None = None) -> int:
    """Delete the control topic's records below ``offset`` (None: every record, as retention does
    to a log whose records all expired while the sink was down); returns the new log start."""
    reader = channel.ControlReader(sink.channel)
    end = reader.end_offset()
    reader.close()
    cut = TopicPartition(sink.control_topic, 0, end if offset is None else offset)
    admin = AdminClient(sink.kafka)  # held until the future is done: a collected client never answers
    admin.delete_records([cut], request_timeout=60, operation_timeout=60)[cut].result(120)
    return cut.offset


def _coordinator_watermark(sink: SinkUnderTest) -> int:
    holder = Consumer({**sink.kafka, "group.id": sink.channel.coordinator_group})
    try:
        return int(holder.committed([TopicPartition(sink.control_topic, 0)], timeout=30)[0].offset)
    finally:
        holder.close()


class _ReadCounter:
    """Counts this sink's control events handed out by every ``ControlReader`` while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events = 0
        read_until = channel.ControlReader.read_until

        def counting(
            reader: channel.ControlReader, *args: Any, **kwargs: Any
        ) -> Iterator[channel.ControlEvent]:
            for item in read_until(reader, *args, **kwargs):
                self.events += 1
                yield item

        monkeypatch.setattr(channel.ControlReader, "read_until", counting)


ROUNDS = 30


def test_start_up_reads_a_bounded_tail_of_a_long_history_and_recovers_the_same_positions(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty rounds of two partitions and two tables (about 300 events), then both groups'
    offsets gone (a downtime past ``offsets.retention.minutes``). Start-up, the planner's recovery,
    the coordinator's open and its first round, must read about one round's events, not the history,
    and still restore every partition's position and commit the next round's rows once."""
    monkeypatch.setattr(control_tail, "TAIL_WINDOW", 64)  # the history must be many windows long
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="t")
    coordinator, worker = sink.coordinator(), sink.worker()
    ids = iter(range(1_000_000))
    for _ in range(ROUNDS):
        for partition in range(2):
            produce_json(sink.bootstrap, sink.topic, partition, [{"id": next(ids), "table": t} for t in "ab"])
        sink.batch(worker)
        coordinator.commit_round()
    coordinator.close()
    worker.close()
    history = channel.ControlReader(sink.channel)
    history.seek(0)
    history_events = sum(1 for _ in history.read_until(history.end_offset(), timeout_s=60))
    history.close()
    per_round = history_events // ROUNDS
    _delete_groups(sink, sink.channel.sink_group, sink.channel.coordinator_group)

    counter = _ReadCounter(monkeypatch)
    found = recovery.recover_positions(sink.channel, [(sink.topic, 0), (sink.topic, 1)])
    assert found.delivered == {(sink.topic, 0): 2 * ROUNDS, (sink.topic, 1): 2 * ROUNDS}
    assert not found.unknown and not found.never_delivered
    restarted = sink.coordinator()
    for partition in range(2):
        produce_json(sink.bootstrap, sink.topic, partition, [{"id": next(ids), "table": "a"}])
    sink.batch()
    restarted.commit_round()
    restarted.close()

    # Two tail reads (recovery, the coordinator's expired group) of one window each, and the first
    # round from the recorded low watermark. Before: recovery read all ~300 events, and so did the
    # coordinator's first round, from offset 0.
    bound = 2 * control_tail.TAIL_WINDOW + 3 * per_round
    assert counter.events <= bound < history_events, f"read {counter.events} of {history_events} events"
    assert sorted(table_ids(catalog, "a") + table_ids(catalog, "b")) == list(range(4 * ROUNDS + 2))


def _batch(sink: SinkUnderTest, first: int, count: int = 10) -> dict[str, list[int]]:
    """``count`` records per partition for tables a and b (ids from ``first`` on), planned as
    Spark's next batch."""
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(2):
        values = [{"id": first + partition * 100 + i, "table": "ab"[i % 2]} for i in range(count)]
        produce_json(sink.bootstrap, sink.topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    sink.plan()
    return expected


def _merge(*batches: dict[str, list[int]]) -> dict[str, list[int]]:
    return {t: sorted(i for b in batches for i in b[t]) for t in "ab"}


def test_coordinator_killed_mid_round_then_everything_before_the_last_complete_round_deleted(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """A complete round, then a batch whose round is SIGKILLed after sink.a's commit; retention
    deletes every event older than the last complete round and the sink group's offsets expire.
    The restart recovers the positions from the tail, replays the batch without delivering it again,
    and commits b once and a not again."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="k")
    first = _batch(sink, 0)
    sink.run_child("worker")
    sink.done()
    sink.run_child("coordinator")
    complete_round = _coordinator_watermark(sink)
    second = _batch(sink, 10_000)
    sink.run_child("worker")
    sink.run_child("coordinator", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    _cut_log_at(sink, complete_round)
    _delete_groups(sink, sink.channel.sink_group)

    found = recovery.recover_positions(sink.channel, [(sink.topic, 0), (sink.topic, 1)])
    assert found.delivered == {(sink.topic, 0): 20, (sink.topic, 1): 20}
    sink.run_child("worker")  # Spark replays the batch: found delivered, skipped
    sink.done()
    assert sink.run_child("coordinator").strip() == '{"sink.a": "already-committed", "sink.b": "committed"}'
    expected = _merge(first, second)
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]


def test_a_sink_down_longer_than_the_retention_after_its_last_round_resumes_exactly(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """A worker SIGKILLed before its commit, its retry, a round that leaves nothing pending; then the
    sink stays down longer than the control topic's retention, which deletes every event (the last
    round's too). The round's mark, kept with the coordinator group's offset, proves nothing deleted
    was needed: the restart reads from the new log start and the next batch lands exactly once."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="r")
    first = _batch(sink, 0)
    sink.run_child("worker", "worker.before-commit=kill", expect=-signal.SIGKILL)
    sink.run_child("worker")
    sink.done()
    sink.run_child("coordinator")
    log_start = _cut_log_at(sink)

    # The app opens its coordinator before the first batch runs. Before: ControlTopicError here.
    sink.coordinator().close()
    assert _coordinator_watermark(sink) == log_start  # acknowledged at once, before any round
    second = _batch(sink, 10_000)
    sink.run_child("worker")
    sink.done()
    # A coordinator opening after the workers wrote again (a crash before the first round) too.
    assert sink.run_child("coordinator").strip() == '{"sink.a": "committed", "sink.b": "committed"}'
    assert _coordinator_watermark(sink) > log_start
    expected = _merge(first, second)
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]


def test_events_pending_when_the_sink_went_down_and_then_deleted_stop_it_instead_of_losing_rows(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """A batch delivered after the last round, the worker SIGKILLed right after its commit, no round
    since; then retention deletes every event. Those events' files were never appended: the
    restart must stop with ControlTopicError (the mark shows writes after the last round), not resume."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="p")
    first = _batch(sink, 0)
    sink.run_child("worker")
    sink.done()
    sink.run_child("coordinator")
    _batch(sink, 10_000)
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    _cut_log_at(sink)

    child = sink.start_child("coordinator")
    _out, err = child.communicate(timeout=180)
    assert child.returncode == 1 and "ControlTopicError" in err and "lost events the sink still needs" in err
    assert table_ids(catalog, "a") == first["a"] and table_ids(catalog, "b") == first["b"]


def test_a_rounds_complete_read_after_a_recreated_topics_first_report_does_not_bring_back_the_old_generation(
    sink_factory: SinkFactory,
) -> None:
    """Issue 47 item 7 (iii), shown: a round's ``CommitComplete`` carries the positions of the
    reports below its round end (``reports_below``), but is written after the round's commits, so a
    worker's report written meanwhile sits between the two. When that report is the first of a
    recreated topic (another topic id, offsets from 0 again), the tail read in offset order took the
    report, then the round's older generation, and gave back the old topic's position (100) for the
    new topic: its records below 100 would never be delivered. A round's positions are taken as of
    its ``reports_below``: the reports at or above it come after them, as the coordinator's own state
    takes them."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="gen")
    channel.ensure_control_topic(sink.channel)
    old, new = "old-topic-id", "new-topic-id"
    producer = TransactionalProducer(
        sink.channel.clients, f"{sink.name}-test-events", fenced_message="fenced"
    )
    with producer.transaction():
        for payload in (
            ev.DataComplete(topic=sink.topic, partition=0, next_offset=100, topic_id=old),  # offset 0
            ev.DataComplete(topic=sink.topic, partition=0, next_offset=5, topic_id=new),  # offset 1
            ev.CommitComplete(
                commit_id="round-1",
                reports_below=1,  # the round's end: the new topic's report came after it
                delivered=ev.delivered_map({(sink.topic, 0): 100}),
                topic_ids={sink.topic: old},
                low_watermark=1,
            ),
        ):
            channel.produce_event(producer, sink.control_topic, sink.name, payload)

    tail = control_tail.read_tail(sink.channel)

    assert tail.complete
    assert tail.positions.of_topic(sink.topic) == {(sink.topic, 0): 5}
    assert tail.positions.recorded_id(sink.topic) == new
