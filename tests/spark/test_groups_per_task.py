"""Several partition groups delivered by one Spark task on threads (``spark.groups-per-task``), so
that one Python worker process serves them instead of one process per group (issue 48, peak RSS).

Each group stays its own commit unit: its own consumer assignment, transactional producer and
transaction, which covers exactly its slices and offsets. The batch's packing into tasks and the
warm-up's task count are checked without Spark; the threads on the real broker and catalog, with
``run_task`` called as an executor's Python worker calls it."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from support.common import table_ids
from support.sink_factory import SinkFactory, packed_sink

from fanout_sink import faults
from fanout_sink.config.loading import parse_config
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice
from fanout_sink.spark import batch, executor_context, planning, task, worker_warmup
from fanout_sink.spark.batch import BatchRunner
from fanout_sink.spark.executor_context import TaskSetup

PARTITIONS = 4


class _Context:
    """``parallelize(elements, numSlices).mapPartitions(task).collect()`` recorded, answering no reports."""

    defaultParallelism = 2

    def __init__(self) -> None:
        self.jobs: list[tuple[list[Any], int]] = []

    def setJobGroup(self, group: str, description: str, interrupt: bool) -> None:
        pass

    def setLocalProperty(self, key: str, value: str | None) -> None:
        pass

    def parallelize(self, elements: Any, numSlices: int) -> _Context:
        self.jobs.append((list(elements), numSlices))
        return self

    def mapPartitions(self, task: Any) -> _Context:
        return self

    def collect(self) -> list[Any]:
        return []


def _config(groups_per_task: int | None) -> Any:
    spark = {"groups-per-task": groups_per_task} if groups_per_task is not None else {}
    return parse_config(
        {"name": "shop", "source": {"topics": ["orders"]}, "tables": {"a.orders": {}}, "spark": spark}
    )


@pytest.mark.parametrize(("groups_per_task", "tasks"), [(None, 5), (1, 5), (2, 3), (5, 1), (8, 1)])
def test_a_batch_packs_its_groups_into_tasks_of_at_most_groups_per_task(
    groups_per_task: int | None, tasks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(groups_per_task)
    ranges = {("orders", p): (0, 10) for p in range(5)}
    monkeypatch.setattr(planning, "planned_ranges", lambda *args: ranges)
    monkeypatch.setattr(batch, "topic_ids", lambda *args: {})
    runner = BatchRunner(
        TaskSetup.of(config, SinkChannel.from_config(config, PartitionGroups(5))),
        retries=1,
        coordinator_error=lambda: None,
    )
    context = _Context()
    runner(SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context)), 0)
    ((groups, slices),) = context.jobs
    assert len(groups) == 5, "every partition group is an element of the job"
    assert slices == tasks, f"{len(groups)} groups in tasks of at most {groups_per_task or 1}"


@pytest.mark.parametrize(("groups_per_task", "warm_ups"), [(1, 2), (2, 1), (4, 1)])
def test_the_warm_up_forks_no_python_worker_a_batch_would_not_use(
    groups_per_task: int, warm_ups: int
) -> None:
    """Two task slots: one warm-up task per slot, or per ``groups-per-task`` slots (warm-up tasks at
    once fork a Python worker each, which then stays alive in the daemon's pool)."""
    config = _config(groups_per_task)
    context = _Context()
    setup = TaskSetup.of(config, SinkChannel.from_config(config, PartitionGroups(2)))
    worker_warmup.start(context, setup).join()
    ((elements, slices),) = context.jobs
    assert (len(elements), slices) == (warm_ups, warm_ups)


def test_one_task_delivers_two_groups_at_once_on_threads_each_in_its_own_transaction(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two groups of a 4-partition topic handed to one task: both threads must have written their
    files before either commits (a barrier at the fault point between files and transaction: one
    group after the other never meets it), each with a consumer of its own; each partition's
    sink-group offset is committed by its own group's transactional id, and every row lands once."""
    sink, expected = packed_sink(sink_factory, groups=2, partitions=PARTITIONS)
    slices = [Slice(t, p, start, end) for (t, p), (start, end) in sorted(sink.plan().items())]
    groups = sink.channel.partition_groups.pack(slices)
    assert len(groups) == 2, groups
    readers: list[threading.Thread] = []

    class ThreadNoting(executor_context.RangeReader):
        def assigned(self, ranges: Any) -> Any:
            readers.append(threading.current_thread())
            return super().assigned(ranges)

    monkeypatch.setattr(executor_context, "RangeReader", ThreadNoting)
    # Freezing the collector is process-wide: not in the test process (tests/spark/test_task_state.py).
    monkeypatch.setattr(executor_context, "freeze_long_lived", lambda: None)
    both_written = threading.Barrier(2, timeout=120)  # a bound for a loaded machine, not a measure

    with faults.register("worker.after-write-files", lambda **_: both_written.wait()):
        reports = list(task.run_task(TaskSetup.of(sink.config, sink.channel), 0, {}, groups))

    assert [r.result.slice.label for r in reports] == [s.label for group in groups for s in group]
    assert all(r.result.transaction_committed and r.result.records_in == 10 for r in reports)
    assert len(set(readers)) == 2, "each group read on a thread of its own"
    offsets = GroupOffsets(sink.channel.clients, sink.channel.sink_group, stable=True)
    try:
        found = offsets.committed_with_metadata([(sink.topic, p) for p in range(PARTITIONS)])
    finally:
        offsets.close()
    assert found == {
        (sink.topic, p): (10, sink.channel.worker_transactional_id(sink.topic, p)) for p in range(PARTITIONS)
    }
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]
