"""The worker commit unit on the real broker and catalog: offsets, skips, gaps, holes, dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from support.common import (
    end_offset,
    make_processor,
    produce_json,
    read_slice,
)
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.errors import OffsetGapError, ProducerFencedError, RecordError
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol import channel, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker


def _control_events(sink: SinkUnderTest) -> list[ev.Payload]:
    """The sink's control events after its coordinator group's committed offset."""
    reader = channel.ControlReader(sink.channel)
    recovery.seek_to_low_watermark(reader)
    try:
        return [e.event.payload for e in reader.read_until(reader.end_offset())]
    finally:
        reader.close()


def _setup(sink_factory: SinkFactory) -> tuple[SinkUnderTest, str, SliceWorker]:
    """A sink of one single-partition source topic, with tables a and b, its control topic and a worker."""
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="s")
    channel.ensure_control_topic(sink.channel)
    return sink, sink.topic, sink.worker()


def test_slice_is_published_with_its_offset_and_redelivery_is_skipped(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, source, worker = _setup(sink_factory)
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(10)])
    raw = read_slice(bootstrap_servers, source, 0, 0, 10)
    process = make_processor(catalog)

    result = worker.commit_slice(Slice(source, 0, 0, 10), raw, process)
    assert result.transaction_committed
    assert result.rows == {"sink.a": 5, "sink.b": 5}
    assert sink.committed(source, 0) == 10
    payloads = _control_events(sink)
    written = [p for p in payloads if isinstance(p, ev.DataWritten)]
    assert sorted(p.table.identifier for p in written) == ["sink.a", "sink.b"]
    assert all(
        p.table.uuid == str(catalog.load_table(p.table.identifier).metadata.table_uuid) for p in written
    )
    complete = [p for p in payloads if isinstance(p, ev.DataComplete)]
    assert [(c.topic, c.partition, c.next_offset) for c in complete] == [(source, 0, 10)]
    assert complete[0].max_timestamp_ms is not None

    # The same slice again (a retried task after its transaction committed): nothing is sent twice.
    again = worker.commit_slice(Slice(source, 0, 0, 10), raw, process)
    assert not again.transaction_committed and again.skipped_delivered == 10
    # An overlapping slice: the delivered head is dropped.
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "a"} for i in range(10, 15)])
    overlap = worker.commit_slice(
        Slice(source, 0, 5, 15), read_slice(bootstrap_servers, source, 0, 5, 15), process
    )
    assert overlap.skipped_delivered == 5 and overlap.rows == {"sink.a": 5}
    assert sink.committed(source, 0) == 15
    assert len([p for p in _control_events(sink) if isinstance(p, ev.DataWritten)]) == 3
    worker.close()


def test_a_source_is_read_only_where_the_sink_group_has_not_delivered(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """A task hands the worker a reader: a replayed slice reads nothing, a partly delivered one
    reads from the committed offset on (fencing and the stable read come first)."""
    sink, source, worker = _setup(sink_factory)
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(15)])
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    reads: list[tuple[int, int]] = []

    def read(first: int, until: int) -> pa.Table:
        reads.append((first, until))
        return reader.read(source, 0, first, until)

    process = make_processor(catalog)
    first = worker.commit_slice(Slice(source, 0, 0, 10), read, process)
    assert first.transaction_committed and first.records_in == 10 and first.rows == {"sink.a": 5, "sink.b": 5}
    replay = worker.commit_slice(Slice(source, 0, 0, 10), read, process)
    assert not replay.transaction_committed and (replay.records_in, replay.skipped_delivered) == (0, 0)
    overlap = worker.commit_slice(Slice(source, 0, 5, 15), read, process)
    assert (overlap.records_in, overlap.skipped_delivered) == (5, 0)
    assert overlap.rows == {"sink.a": 3, "sink.b": 2}  # ids 10-14 only
    assert reads == [(0, 10), (10, 15)], "the replay read nothing, the overlap only what was left"
    assert sink.committed(source, 0) == 15
    reader.close()
    worker.close()


def test_gap_fails_loudly_naming_the_offsets(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, source, worker = _setup(sink_factory)
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "a"} for i in range(20)])
    process = make_processor(catalog)
    worker.commit_slice(Slice(source, 0, 0, 10), read_slice(bootstrap_servers, source, 0, 0, 10), process)
    with pytest.raises(OffsetGapError, match=rf"gap in {source}\[0\].*up to offset 10.*\[12, 20\)"):
        worker.commit_slice(
            Slice(source, 0, 12, 20), read_slice(bootstrap_servers, source, 0, 12, 20), process
        )
    assert sink.committed(source, 0) == 10
    worker.close()


def test_a_bad_record_stops_the_slice_naming_where_a_restart_reads_again(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Issue 47 item 6: the data stop said "a restart resumes at this record" (offset 16) while nothing
    of the partition was committed and the next run read it from 0. The worker knows what the sink
    group holds: it names the offset a restart reads from, and the driver finds it in Spark's text."""
    sink, source, worker = _setup(sink_factory)
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "a"} for i in range(20)])
    good = make_processor(catalog)

    def strict(raw: pa.Table) -> Any:
        for record in raw.to_pylist():
            if json.loads(record["value"])["id"] == 16:
                at = (record["topic"], record["partition"], record["offset"])
                raise RecordError(*at, "convert", "column 'id': cannot convert")
        return good(raw)

    with pytest.raises(RecordError) as nothing:
        worker.commit_slice(Slice(source, 0, 0, 20), read_slice(bootstrap_servers, source, 0, 0, 20), strict)
    stopped = str(nothing.value).splitlines()[1]
    assert stopped == (
        f"  the sink stopped: nothing of {source}[0] is committed yet, so a restart reads it again from "
        "offset 0 and stops at this record again"
    )
    assert sink.committed(source, 0) is None
    worker.commit_slice(Slice(source, 0, 0, 10), read_slice(bootstrap_servers, source, 0, 0, 10), good)
    with pytest.raises(RecordError) as after:
        worker.commit_slice(Slice(source, 0, 5, 20), read_slice(bootstrap_servers, source, 0, 5, 20), strict)
    assert f"{source}[0] is committed up to offset 10, so a restart reads it again from offset 10" in str(
        after.value
    )
    for error in (nothing.value, after.value):
        found = RecordError.find(f"Job aborted.\nfanout_sink.errors.RecordError: {error}\n\tat org.apache")
        assert found is not None and str(found) == str(error)
    worker.close()


def test_holes_from_aborted_records_commit_the_planned_end_and_dead_letters_ride_along(
    bootstrap_servers: str, make_topic: Callable[..., str], sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, source, _ = _setup(sink_factory)
    dlq = make_topic("dlq")
    worker = sink.worker(dead_letter_topic=dlq)
    produce_json(
        bootstrap_servers, source, 0, [{"id": 1, "table": "a"}, b"not json", {"id": 2, "table": "skip"}]
    )
    # An aborted transaction and its marker occupy offsets that no reader ever sees.
    from confluent_kafka import Producer

    aborting = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"abort-{source}"})
    aborting.init_transactions(30)
    aborting.begin_transaction()
    aborting.produce(source, value=b'{"id": 666, "table": "a"}', partition=0)
    aborting.flush(30)
    aborting.abort_transaction(30)
    end = end_offset(bootstrap_servers, source, 0)
    assert end == 5  # 3 records, 1 aborted record, 1 abort marker
    raw = read_slice(bootstrap_servers, source, 0, 0, end)
    assert raw.num_rows == 3

    result = worker.commit_slice(Slice(source, 0, 0, end), raw, make_processor(catalog))
    assert (result.rows, result.dead_lettered, result.filtered) == ({"sink.a": 1}, 1, 1)
    assert sink.committed(source, 0) == end

    reader = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "dlq-check",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(dlq, 0, 0)])
    letters = []
    while True:
        msg = reader.poll(10)
        assert msg is not None
        if msg.error() and msg.error().code() == KafkaError._PARTITION_EOF:
            break
        letters.append(msg)
    reader.close()
    assert [m.value() for m in letters] == [b"not json"]
    assert dict(letters[0].headers())["fanout-sink.reason"].startswith(f"not JSON at {source}[0]@1".encode())

    # A slice with no visible record still moves the offset to its planned end.
    aborting.begin_transaction()
    aborting.produce(source, value=b'{"id": 667, "table": "a"}', partition=0)
    aborting.flush(30)
    aborting.abort_transaction(30)
    later = end_offset(bootstrap_servers, source, 0)
    empty = read_slice(bootstrap_servers, source, 0, end, later)
    assert empty.num_rows == 0
    worker.commit_slice(Slice(source, 0, end, later), empty, make_processor(catalog))
    assert sink.committed(source, 0) == later
    worker.close()


def test_zombie_attempt_is_fenced_and_the_newer_attempt_delivers_once(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """I3: attempt 1 stalls after writing its files; attempt 2 runs the same slice; attempt 1 wakes up."""
    sink, source, zombie = _setup(sink_factory)
    produce_json(bootstrap_servers, source, 0, [{"id": i, "table": "a"} for i in range(6)])
    raw = read_slice(bootstrap_servers, source, 0, 0, 6)
    process = make_processor(catalog)
    successor_results: list[Any] = []
    started: list[bool] = []

    def successor_runs(**_: object) -> None:
        if started:
            return
        started.append(True)
        successor = sink.worker()
        successor_results.append(successor.commit_slice(Slice(source, 0, 0, 6), raw, process))
        successor.close()

    with faults.register("worker.after-write-files", successor_runs), pytest.raises(ProducerFencedError):
        zombie.commit_slice(Slice(source, 0, 0, 6), raw, process)
    assert successor_results[0].transaction_committed
    written = [p for p in _control_events(sink) if isinstance(p, ev.DataWritten)]
    assert len(written) == 1 and sum(f.record_count for f in written[0].files) == 6
    # The fenced producer was dropped: the zombie's next call fences back and finds the slice delivered.
    assert zombie.commit_slice(Slice(source, 0, 0, 6), raw, process).skipped_delivered == 6
    zombie.close()


def test_cached_producer_fenced_by_a_moved_task_starts_over_without_failing(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Executor 1 commits batch 1, executor 2 commits batch 2 (fencing executor 1's cached producer),
    executor 1 gets batch 3: it must deliver it, not fail the task. It sees that another process
    delivered the range in between and starts with a new producer, without doing the slice's work
    for a fenced one first; a fence it cannot see coming (an attempt elsewhere that delivered
    nothing) is met at the transaction and the slice starts over."""
    sink, source, first = _setup(sink_factory)
    process = make_processor(catalog)
    second = sink.worker()
    caplog.set_level("INFO", logger="fanout_sink.protocol.worker")

    def deliver(worker: SliceWorker, batch: int) -> SliceResult:
        start, end = batch * 3, batch * 3 + 3
        return worker.commit_slice(
            Slice(source, 0, start, end), read_slice(bootstrap_servers, source, 0, start, end), process
        )

    for batch, worker in enumerate((first, second, first)):
        produce_json(bootstrap_servers, source, 0, [{"id": batch * 10 + i, "table": "a"} for i in range(3)])
        result = deliver(worker, batch)
        assert result.transaction_committed and result.rows == {"sink.a": 3}
    assert sink.committed(source, 0) == 9
    assert "was fenced since its last use" not in caplog.text, "the moved task was seen before the work"
    third = sink.worker()  # an attempt elsewhere: its new producer fences, it finds the range delivered
    assert not deliver(third, 2).transaction_committed
    produce_json(bootstrap_servers, source, 0, [{"id": 30 + i, "table": "a"} for i in range(3)])
    result = deliver(first, 3)
    assert result.transaction_committed and result.rows == {"sink.a": 3}
    assert "was fenced since its last use" in caplog.text
    written = [p for p in _control_events(sink) if isinstance(p, ev.DataWritten)]
    assert [w.next_offset for w in written] == [3, 6, 9, 12]
    first.close()
    second.close()
    third.close()
