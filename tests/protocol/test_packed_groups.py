"""Partition packing on a real broker: a group's partitions in one transaction, kills mid-task, and a
restart under another group count (issue 32 item 1).

Children are the real worker script (``tests/support/run_worker.py``), SIGKILLed or held at named
fault points; rows are counted in the tables afterwards.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.common import make_processor, read_slice, run_planned_batch, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest, packed_sink

from fanout_sink import faults
from fanout_sink.errors import ProducerFencedError, StartSupersededError
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import group_layout
from fanout_sink.protocol.channel import SinkChannel, ensure_control_topic
from fanout_sink.protocol.offset_metadata import LayoutRecord
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.recovery import PositionWriter
from fanout_sink.protocol.slice_writer import SliceSource
from fanout_sink.protocol.slices import Slice
from fanout_sink.protocol.worker import SliceWorker

PARTITIONS = 4


def _started_sink(
    sink_factory: SinkFactory, start: str
) -> tuple[SinkUnderTest, dict[str, list[int]], list[tuple[str, int]], SinkChannel]:
    """A 2-group sink (:func:`~support.sink_factory.packed_sink`) whose app started as ``start``: its
    control topic made and its start and layout recorded, as the app does before its first batch."""
    sink, expected = packed_sink(sink_factory, groups=2)
    partitions = [(sink.topic, p) for p in range(PARTITIONS)]
    ensure_control_topic(sink.channel)
    app = dataclasses.replace(sink.channel, start_id=start)
    group_layout.fence_other_layouts(app, partitions)
    return sink, expected, partitions, app


def _offsets(sink: SinkUnderTest, stable: bool = True) -> dict[int, tuple[int | None, str]]:
    """Per partition, the sink group's offset and its metadata (``stable=False``: without waiting for
    a killed attempt's transaction, which stays open until it is fenced)."""
    reader = GroupOffsets(sink.channel.clients, sink.channel.sink_group, stable=stable)
    try:
        found = reader.committed_with_metadata([(sink.topic, p) for p in range(PARTITIONS)])
    finally:
        reader.close()
    return {partition: entry for (_, partition), entry in found.items()}


def _parquet(tmp_path: Path, table: str) -> list[Path]:
    return [p for p in (tmp_path / "warehouse").rglob("*.parquet") if f"/{table}/" in str(p)]


def test_one_group_delivers_all_its_partitions_in_one_transaction_and_one_file_per_table(
    sink_factory: SinkFactory, catalog: Any, tmp_path: Path
) -> None:
    sink, expected = packed_sink(sink_factory, groups=1)
    worker = sink.worker()
    try:
        results = run_planned_batch(worker, sink.bootstrap, sink.plan(), make_processor(catalog))
    finally:
        worker.close()
    assert [(r.slice.partition, r.transaction_committed) for r in results] == [
        (p, True) for p in range(PARTITIONS)
    ]
    assert sum(r.rows.get("sink.a", 0) for r in results) == len(expected["a"])
    # One data file per table for the task, not one per partition.
    assert len(_parquet(tmp_path, "a")) == 1 and len(_parquet(tmp_path, "b")) == 1
    # Every partition's offset names the group's transactional id (what a later layout fences).
    assert _offsets(sink) == {p: (10, "fanout-sink:" + sink.name + ":groups:1:0") for p in range(PARTITIONS)}
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]


def test_a_worker_killed_between_two_groups_of_a_batch_delivers_each_record_once_after_the_replay(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """SIGKILL right after the first group's transaction (mid-batch: the second group never ran), then
    after its transaction was sent but before it committed; each replay of the batch delivers the
    rest once."""
    sink, expected = packed_sink(sink_factory, groups=2)
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    done = {p for p, (offset, _) in _offsets(sink).items() if offset == 10}
    assert done and len(done) < PARTITIONS  # exactly the first group's partitions, all of them
    assert {sink.channel.partition_groups.group_of(sink.topic, p) for p in done} == {0}
    sink.run_child("worker", "worker.before-commit=kill", expect=-signal.SIGKILL)
    assert {p for p, (offset, _) in _offsets(sink, stable=False).items() if offset == 10} == done
    sink.run_child("worker")
    assert {p: offset for p, (offset, _) in _offsets(sink).items()} == dict.fromkeys(range(PARTITIONS), 10)
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]


def test_a_restart_with_another_group_count_fences_the_old_layouts_open_transaction_first(
    sink_factory: SinkFactory, catalog: Any, tmp_path: Path
) -> None:
    """I3 across layouts: a worker of the 2-group layout holds its transaction open (a live zombie);
    the driver starts with 3 groups, whose ids the zombie's would not fence. Starting fences the old
    ids first, so the 3-group worker delivers everything and the zombie's commit fails."""
    sink, expected = packed_sink(sink_factory, groups=2)
    ensure_control_topic(sink.channel)  # as the app does before it fences and records its layout
    assert group_layout.fence_other_layouts(sink.channel, [(sink.topic, p) for p in range(PARTITIONS)]) == 0
    release = tmp_path / "release-zombie"
    zombie = sink.start_child("worker", f"worker.before-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while not _parquet(tmp_path, "a") and time.monotonic() < deadline:
        time.sleep(0.1)  # the zombie has written its first group's files and is about to commit
    time.sleep(1.0)

    three = dataclasses.replace(sink.channel, partition_groups=PartitionGroups(3))
    fenced = group_layout.fence_other_layouts(three, [(sink.topic, p) for p in range(PARTITIONS)])
    assert fenced == 2  # both ids of the recorded 2-group layout
    worker = SliceWorker(three)
    try:
        results = run_planned_batch(worker, sink.bootstrap, sink.plan(), make_processor(catalog))
    finally:
        worker.close()
    assert all(r.transaction_committed for r in results)
    release.touch()
    _out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 1 and "ProducerFencedError" in err, err[-2000:]
    # Recorded: the next start under the same count fences nothing.
    assert group_layout.fence_other_layouts(three, [(sink.topic, p) for p in range(PARTITIONS)]) == 0
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]


def test_the_first_start_with_packing_fences_the_partitions_own_ids_that_delivered_before(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """A sink that ran before packing (one transactional id per partition, offsets without a name)
    has no layout record: the ids that committed the sink group's offsets are fenced."""
    sink, _expected = packed_sink(sink_factory, groups=2)
    unpacked = dataclasses.replace(sink.channel, partition_groups=PartitionGroups())
    worker = SliceWorker(unpacked)
    try:
        run_planned_batch(worker, sink.bootstrap, sink.plan(), make_processor(catalog))
    finally:
        worker.close()
    assert {metadata for _, metadata in _offsets(sink).values()} == {
        f"fanout-sink:{sink.name}:{sink.topic}:{p}" for p in range(PARTITIONS)
    }
    assert (
        group_layout.fence_other_layouts(sink.channel, [(sink.topic, p) for p in range(PARTITIONS)])
        == PARTITIONS
    )


def test_an_old_layouts_attempt_with_a_new_producer_after_another_start_cannot_commit(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """I3 across layouts after the start (issue 47 item 1): the 2-group app delivered batch 0 and
    caches its producers; a start with 3 groups fences them. The old app's next batch meets its
    fenced cached producers and retries with new ones under the same old ids (as a Spark task retry
    or a lingering executor would), while a 3-group worker delivers the same ranges: its stable read
    came before the old attempt's commit. Only one of the two may commit each range."""
    sink, expected, partitions, old_app = _started_sink(sink_factory, "old-start")
    old_worker = SliceWorker(old_app)
    new_worker: SliceWorker | None = None
    try:
        first_half = {key: (0, 5) for key in partitions}
        run_planned_batch(old_worker, sink.bootstrap, first_half, make_processor(catalog))

        new_app = dataclasses.replace(old_app, partition_groups=PartitionGroups(3), start_id="new-start")
        assert group_layout.fence_other_layouts(new_app, partitions) == 2
        new_worker = SliceWorker(new_app)
        second_half = [Slice(t, p, 5, 10) for t, p in partitions]
        old_outcome: list[str] = []

        def old_batch_meanwhile(start: int, end: int) -> pa.Table:
            """The new worker has fenced and read the offsets; the old app's batch runs now."""
            if not old_outcome:
                try:
                    ranges = {key: (5, 10) for key in partitions}
                    run_planned_batch(old_worker, sink.bootstrap, ranges, make_processor(catalog))
                    old_outcome.append("committed")
                except ProducerFencedError as exc:
                    old_outcome.append(str(exc))
            return read_slice(sink.bootstrap, sink.topic, 0, start, end)

        for group in new_app.partition_groups.pack(second_half):
            work: list[tuple[Slice, pa.Table | SliceSource]] = [
                (
                    s,
                    old_batch_meanwhile
                    if s.partition == 0
                    else read_slice(sink.bootstrap, s.topic, s.partition, 5, 10),
                )
                for s in group
            ]
            new_worker.commit_partition_group(work, make_processor(catalog))
    finally:
        old_worker.close()
        if new_worker is not None:
            new_worker.close()
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]
    assert len(old_outcome) == 1 and "was started again (start new-start" in old_outcome[0], old_outcome


def test_a_superseded_starts_position_writer_cannot_commit(sink_factory: SinkFactory, catalog: Any) -> None:
    """The old app's offset refresher (``recovery.PositionWriter``) re-commits what it read: after a
    start with another count, its commit could move back an offset the new layout's worker
    committed meanwhile, so it stops like the old app's workers."""
    sink, _expected, partitions, old_app = _started_sink(sink_factory, "old-start")
    worker = SliceWorker(old_app)
    try:
        run_planned_batch(worker, sink.bootstrap, sink.plan(), make_processor(catalog))
    finally:
        worker.close()
    new_app = dataclasses.replace(old_app, partition_groups=PartitionGroups(3), start_id="new-start")
    group_layout.fence_other_layouts(new_app, partitions)
    old_writer = PositionWriter(old_app)
    try:
        with pytest.raises(StartSupersededError, match="start new-start, 3 partition group"):
            old_writer.commit(sink.topic, 0, 10, expected=10)
    finally:
        old_writer.close()
    new_writer = PositionWriter(new_app)
    try:
        assert new_writer.commit(sink.topic, 0, 10, expected=10) == 10
    finally:
        new_writer.close()


def test_a_start_stopped_between_recording_and_fencing_leaves_the_old_ids_to_the_next_start(
    sink_factory: SinkFactory,
) -> None:
    """The record names the layouts a start has yet to fence; a start that dies before fencing them
    (after recording itself) leaves them to the next start, even one under the same count."""
    sink, _expected, partitions, _first = _started_sink(sink_factory, "first")
    old_id = sink.channel.worker_transactional_id(sink.topic, 0)
    zombie = TransactionalProducer(sink.channel.clients, old_id, fenced_message="the zombie was fenced")

    def dies(**_: Any) -> None:
        raise KeyboardInterrupt

    three = dataclasses.replace(sink.channel, partition_groups=PartitionGroups(3), start_id="second")
    with faults.register("layout.recorded", dies), pytest.raises(KeyboardInterrupt):
        group_layout.fence_other_layouts(three, partitions)
    record = group_layout.read_record(three, stable=True)
    assert record == LayoutRecord(PartitionGroups(3), "second", (PartitionGroups(2),))

    again = dataclasses.replace(three, start_id="third")
    assert group_layout.fence_other_layouts(again, partitions) == 2
    assert group_layout.read_record(again, stable=True) == LayoutRecord(PartitionGroups(3), "third")
    with pytest.raises(ProducerFencedError, match="the zombie was fenced"), zombie.transaction():
        zombie.produce(sink.control_topic, b"late")


def test_two_starts_at_once_cannot_both_record_their_layout_unseen(
    sink_factory: SinkFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starts record under one transactional id: a start whose record another start overtook (between
    its read and its write) is fenced and stops, so the winner fenced every layout before it."""
    sink, _expected, partitions, _first = _started_sink(sink_factory, "first")
    slow = dataclasses.replace(sink.channel, partition_groups=PartitionGroups(3), start_id="slow")
    fast = dataclasses.replace(sink.channel, partition_groups=PartitionGroups(4), start_id="fast")
    read = group_layout.read_record
    overtaken: list[int] = []

    def overtaking_read(channel: SinkChannel, stable: bool = False) -> LayoutRecord | None:
        found = read(channel, stable)
        if channel.start_id == "slow" and not overtaken:
            overtaken.append(group_layout.fence_other_layouts(fast, partitions))
        return found

    monkeypatch.setattr(group_layout, "read_record", overtaking_read)
    with pytest.raises(ProducerFencedError, match="recorded its partition-group layout at the same time"):
        group_layout.fence_other_layouts(slow, partitions)
    monkeypatch.undo()
    assert overtaken == [2]
    assert group_layout.read_record(fast, stable=True) == LayoutRecord(PartitionGroups(4), "fast")
