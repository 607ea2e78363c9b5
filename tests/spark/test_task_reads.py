"""A Spark task's group of source partitions read from one consumer assignment (spark/task.py),
without Spark: ``run_task`` is called as an executor's Python worker calls it."""

from __future__ import annotations

from typing import Any

import pytest
from support.common import CountedConsumer, produce_json, table_ids
from support.sink_factory import SinkFactory

from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol.slices import Slice
from fanout_sink.spark import executor_context, task

TOPICS = 6


def test_a_task_reads_its_group_of_one_partition_topics_from_one_assignment(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole database's one-partition topics in one group (issue 32): the task's reader assigned
    each range alone, ~1 s per partition before its first fetch. Counted, not timed: one assignment
    for the group, no seek, every slice delivered exactly in the group's one transaction."""
    sink = sink_factory(partitions={f"db{n}": 1 for n in range(TOPICS)}, tables="ab", partition_groups=1)
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for n, topic in enumerate(sorted(sink.partitions)):
        values = [{"id": n * 100 + i, "table": "ab"[i % 2]} for i in range(5)]
        produce_json(sink.bootstrap, topic, 0, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    slices = [Slice(t, p, start, end) for (t, p), (start, end) in sorted(sink.plan().items())]
    consumers: list[CountedConsumer] = []

    class CountingReader(RangeReader):
        def __init__(self, clients: KafkaClientFactory, group: str) -> None:
            super().__init__(clients, group)
            consumers.append(CountedConsumer(self._consumer))
            self._consumer = consumers[-1]

    monkeypatch.setattr(executor_context, "RangeReader", CountingReader)
    # Freezing the collector is process-wide: not in the test process (tests/spark/test_task_state.py).
    monkeypatch.setattr(executor_context, "freeze_long_lived", lambda: None)

    reports = list(task.run_task(executor_context.TaskSetup.of(sink.config, sink.channel), 0, {}, [slices]))

    delivered = [(r.result.slice.label, r.result.records_in, r.result.transaction_committed) for r in reports]
    assert delivered == [(s.label, 5, True) for s in slices]
    (counted,) = consumers
    assert (counted.calls["assign"], counted.calls["unassign"], counted.calls["seek"]) == (1, 1, 0)
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == sorted(expected["a"]) and table_ids(catalog, "b") == sorted(
        expected["b"]
    )
