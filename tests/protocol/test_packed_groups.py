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

from support.common import make_processor, produce_json, run_planned_batch, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol import group_layout
from fanout_sink.protocol.channel import ensure_control_topic
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.worker import SliceWorker

PARTITIONS = 4


def _packed_sink(sink_factory: SinkFactory, groups: int) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Tables a and b, ten records per partition of a 4-partition topic, batch 0 planned."""
    sink = sink_factory(partitions={"src": PARTITIONS}, tables="ab", prefix="pack", partition_groups=groups)
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(PARTITIONS):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10)]
        produce_json(sink.bootstrap, sink.topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    sink.plan()
    return sink, {t: sorted(v) for t, v in expected.items()}


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
    sink, expected = _packed_sink(sink_factory, groups=1)
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
    sink, expected = _packed_sink(sink_factory, groups=2)
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    done = {p for p, (offset, _) in _offsets(sink).items() if offset == 10}
    assert done and len(done) < PARTITIONS  # exactly the first group's partitions, all of them
    assert {sink.channel.groups.group_of(sink.topic, p) for p in done} == {0}
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
    sink, expected = _packed_sink(sink_factory, groups=2)
    ensure_control_topic(sink.channel)  # as the app does before it fences and records its layout
    assert group_layout.fence_other_layouts(sink.channel, [(sink.topic, p) for p in range(PARTITIONS)]) == 0
    release = tmp_path / "release-zombie"
    zombie = sink.start_child("worker", f"worker.before-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while not _parquet(tmp_path, "a") and time.monotonic() < deadline:
        time.sleep(0.1)  # the zombie has written its first group's files and is about to commit
    time.sleep(1.0)

    three = dataclasses.replace(sink.channel, groups=PartitionGroups(3))
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
    sink, _expected = _packed_sink(sink_factory, groups=2)
    unpacked = dataclasses.replace(sink.channel, groups=PartitionGroups())
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
