"""Paced transactions (issue 48 items 1-2): a partition group's planned slices delivered in steps,
each one transaction, on the real broker, catalog and reader; a failure between two steps and the
task's rerun deliver every record exactly once."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest
from support.common import end_offset, make_processor, produce_json, read_slice, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.faults import InjectedFault
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import worker as worker_module
from fanout_sink.protocol.pacing import StepPacer, deliver_in_steps, next_step
from fanout_sink.protocol.slice_writer import SliceSource
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker

CHUNK = 50
RECORDS = 300
"""Per partition: a first step of 4 chunks (200), then steps of one chunk (the pacer's target is
tiny): partition 0 in [0, 200), [200, 250), [250, 300), then partition 1 in six steps."""


def _sink(sink_factory: SinkFactory) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Two partitions in one partition group, tables a and b, :data:`RECORDS` records each."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="steps", partition_groups=1)
    channel.ensure_control_topic(sink.channel)
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(2):
        values = [{"id": partition * 10_000 + i, "table": "ab"[i % 2]} for i in range(RECORDS)]
        produce_json(sink.bootstrap, sink.topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    return sink, {t: sorted(v) for t, v in expected.items()}


def _deliver(sink: SinkUnderTest, worker: SliceWorker, reader: RangeReader) -> list[SliceResult]:
    """The partition group's task as ``spark/task.py`` runs it: one assignment around all steps."""
    slices = [Slice(sink.topic, p, 0, RECORDS) for p in range(2)]
    work: list[tuple[Slice, SliceSource]] = [
        (s, functools.partial(reader.read_chunks, s.topic, s.partition, max_records=CHUNK)) for s in slices
    ]
    with reader.assigned([(s.topic, s.partition, s.start, s.end) for s in slices]):
        return deliver_in_steps(worker, work, make_processor(sink.catalog), StepPacer(1e-9, CHUNK))


def _completes(sink: SinkUnderTest) -> list[tuple[int, int]]:
    """Every ``DataComplete`` on the sink's control topic: (partition, next_offset), in order."""
    reader = channel.ControlReader(sink.channel)
    recovery.seek_to_low_watermark(reader)
    try:
        payloads = [e.event.payload for e in reader.read_until(reader.end_offset())]
    finally:
        reader.close()
    return [(p.partition, p.next_offset) for p in payloads if isinstance(p, ev.DataComplete)]


def _assert_exact_after_a_round(sink: SinkUnderTest, expected: dict[str, list[int]]) -> None:
    """A commit round, then every id in its table exactly once."""
    coordinator = sink.coordinator()
    coordinator.commit_round()
    coordinator.close()
    assert table_ids(sink.catalog, "a") == expected["a"] and table_ids(sink.catalog, "b") == expected["b"]


def test_a_partition_group_is_delivered_in_steps_each_its_own_transaction(
    sink_factory: SinkFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, expected = _sink(sink_factory)
    worker = sink.worker(chunk_records=CHUNK)
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    created: list[str] = []

    class Counted(TransactionalProducer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            created.append(args[1])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(worker_module, "TransactionalProducer", Counted)
    results = _deliver(sink, worker, reader)
    assert len(created) == 1, "one producer (one init_transactions) for all of a task's steps"

    assert [(r.slice.partition, r.slice.start, r.slice.end) for r in results] == [
        (0, 0, RECORDS),
        (1, 0, RECORDS),
    ]
    assert all(r.transaction_committed and r.records_in == RECORDS for r in results), (
        "one merged result per slice"
    )
    assert results[0].rows == {"sink.a": RECORDS // 2, "sink.b": RECORDS // 2}
    ends = [200, 250, 300]
    assert _completes(sink) == [(0, e) for e in ends] + [(1, e) for e in range(CHUNK, RECORDS + 1, CHUNK)]
    assert sink.committed(sink.topic, 0) == sink.committed(sink.topic, 1) == RECORDS
    _assert_exact_after_a_round(sink, expected)
    reader.close()
    worker.close()


def test_a_failure_between_steps_then_the_tasks_rerun_deliver_every_record_once(
    sink_factory: SinkFactory,
) -> None:
    sink, expected = _sink(sink_factory)
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    worker = sink.worker(chunk_records=CHUNK)

    def fail_after_fourth_step(step: int, **_context: Any) -> None:
        if step == 4:
            raise InjectedFault("task lost between steps")

    with faults.register("worker.between-steps", fail_after_fourth_step), pytest.raises(InjectedFault):
        _deliver(sink, worker, reader)
    assert sink.committed(sink.topic, 0) == RECORDS and sink.committed(sink.topic, 1) == CHUNK
    worker.close()

    # Spark runs the task again, in another process: a new worker, the same planned slices.
    again = sink.worker(chunk_records=CHUNK)
    results = _deliver(sink, again, reader)
    assert not results[0].transaction_committed and results[0].skipped_delivered == 0
    assert results[1].transaction_committed and results[1].committed_before == CHUNK
    assert results[1].records_in == RECORDS - CHUNK, (
        "the rest of partition 1, read from the sink group's offset"
    )
    assert sink.committed(sink.topic, 1) == RECORDS
    _assert_exact_after_a_round(sink, expected)
    reader.close()
    again.close()


def test_a_group_of_small_slices_that_fits_goes_in_one_step() -> None:
    small = [Slice("t", p, 0, 300) for p in range(100)]
    step, rest = next_step(small, 40_000)
    assert step == small and rest == []
    step, rest = next_step([Slice("t", 0, 10, 1_000)], 300)
    assert step == [Slice("t", 0, 10, 310)] and rest == [Slice("t", 0, 310, 1_000)]
    # A cut leaving a small tail takes the tail along.
    step, rest = next_step([Slice("t", 0, 0, 1_050)], 1_000)
    assert step == [Slice("t", 0, 0, 1_050)] and rest == []


def test_the_pacer_sizes_steps_from_the_measured_rate() -> None:
    pacer = StepPacer(target_s=5.0, chunk_records=1_000)
    assert pacer.budget() == 4_000, "before any measure: a few chunks"
    pacer.measured(4_000, 1.0)
    assert pacer.budget() == 16_000, "grows at most 4x a step"
    for _ in range(10):
        pacer.measured(pacer.budget(), pacer.budget() / 100_000)
    assert abs(pacer.budget() - 500_000) < 5_000, "rate x target once settled"


@pytest.mark.parametrize("transactions", [False, True], ids=["dense", "markers"])
def test_steps_of_one_partition_read_exactly_their_records_inside_one_assignment(
    sink_factory: SinkFactory, transactions: bool
) -> None:
    """A step's sub-range that ends where the next one starts leaves the partition fetching (no seek
    for the next step) only when the reader handed out exactly the records before the end: with
    transaction markers a read may take records past it, and then the next one seeks."""
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="subrange")
    for batch in range(12):
        values = [{"id": batch * 10 + i, "table": "a"} for i in range(7)]
        produce_json(
            sink.bootstrap, sink.topic, 0, values, txn_id=f"{sink.name}-src" if transactions else None
        )
    end = end_offset(sink.bootstrap, sink.topic, 0)
    everything = read_slice(sink.bootstrap, sink.topic, 0, 0, end)["offset"].to_pylist()
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    cuts = [0, 5, 13, 14, 30, 51, end]
    with reader.assigned([(sink.topic, 0, 0, end)]):
        for start, until in itertools.pairwise(cuts):
            offsets = [
                o for t in reader.read_chunks(sink.topic, 0, start, until, 4) for o in t["offset"].to_pylist()
            ]
            assert offsets == [o for o in everything if start <= o < until], (start, until)
    reader.close()
