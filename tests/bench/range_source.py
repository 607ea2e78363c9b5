"""The planner prototype's source: a PySpark Python streaming data source over Kafka ranges.

Its offsets are the broker's last stable offsets in Spark's Kafka source's JSON shape
(``{topic: {partition: offset}}``); its partitions are the per-partition ranges of a micro-batch,
capped like ``maxOffsetsPerTrigger``; its ``read`` runs the product's task
(:func:`fanout_sink.spark.task.run_task`) on one range and yields one row: the pickled
:class:`~fanout_sink.spark.task.SliceReport`. :mod:`.python_source` runs the app with it.

Spark unpickles the source and its reader in several short-lived Python processes of the driver
(the source lookup, its creation, each read's planning, the streaming source runner), so this
module imports only the standard library and ``pyspark.sql.datasource`` at the top: the sink's
modules (pydantic, pyarrow, PyIceberg) are imported by the methods that use them, and the reader
travels as the YAML's path. Imported at the top, they made each of those processes ~200 MB.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

if TYPE_CHECKING:
    from fanout_sink.kafka.clients import KafkaClientFactory
    from fanout_sink.spark.executor_context import TaskSetup

SOURCE_NAME = "fanout_sink_ranges"
SUMMARY_SCHEMA = "topic string, partition int, report binary"

Offsets = dict[str, dict[str, int]]
"""Spark's Kafka source's offset JSON: ``{topic: {partition: offset}}`` (partitions as strings)."""


def flat(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(topic, int(part)): off for topic, parts in offsets.items() for part, off in parts.items()}


def nested(offsets: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, part), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = off
    return out


def capped(
    base: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], cap: int | None
) -> dict[tuple[str, int], int]:
    """The next batch's ends: at most ``cap`` records past ``base`` in all, shared by the partitions in
    proportion to their backlog (the rule of Spark's Kafka source for ``maxOffsetsPerTrigger``)."""
    backlog = {key: max(end - base.get(key, 0), 0) for key, end in ends.items()}
    total = sum(backlog.values())
    if cap is None or total <= cap:
        return dict(ends)
    out = {}
    for key, end in ends.items():
        share = cap * backlog[key] / total
        out[key] = min(end, base.get(key, 0) + int(math.ceil(share) if share < 1 else math.floor(share)))
    return out


@dataclass(frozen=True)
class RangePartition(InputPartition):  # type: ignore[misc]
    """One task's input: a source partition's planned range and its topic's id."""

    topic: str
    partition: int
    start: int
    end: int
    topic_id: str | None


class RangeStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """Plans in Spark's Python source runner (a process of the driver); reads in the executors' workers."""

    def __init__(self, config_path: str, starting: Offsets, cap: int | None, until: Offsets | None) -> None:
        self.config_path = config_path
        self.starting = starting
        self.cap = cap
        self.until = flat(until) if until is not None else None
        self._base = flat(starting)
        self._setup: TaskSetup | None = None
        self._clients: KafkaClientFactory | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Travels as the YAML's path: unpickling needs no pydantic, and librdkafka handles stay in
        # the process that made them.
        return {**self.__dict__, "_setup": None, "_clients": None}

    @property
    def setup(self) -> TaskSetup:
        """The tasks' config and channel, as the app's batches make them; one range per task, so
        each partition delivers under its own transactional id (ranges of one group delivered by
        concurrent tasks would fence each other)."""
        if self._setup is None:
            from fanout_sink.config.loading import load_config
            from fanout_sink.protocol.channel import SinkChannel
            from fanout_sink.protocol.partition_groups import PartitionGroups
            from fanout_sink.spark.executor_context import TaskSetup

            config = load_config(self.config_path)
            self._setup = TaskSetup.of(config, SinkChannel.from_config(config, PartitionGroups()))
        return self._setup

    @property
    def clients(self) -> KafkaClientFactory:
        if self._clients is None:
            self._clients = self.setup.channel.clients
        return self._clients

    def initialOffset(self) -> Offsets:
        return self.starting

    def latestOffset(self) -> Offsets:
        from fanout_sink.kafka.offsets import source_positions

        topics = sorted(self.starting)
        sink_group = self.setup.channel.sink_group
        ends = {(p.topic, p.partition): p.end for p in source_positions(self.clients, sink_group, topics)}
        if self.until is not None:
            ends = {key: min(end, self.until.get(key, end)) for key, end in ends.items()}
        planned = capped(self._base, ends, self.cap)
        # Never behind what was planned already (a lower end would be a batch backwards).
        planned = {key: max(end, self._base.get(key, 0)) for key, end in planned.items()}
        self._base.update(planned)
        return nested(planned)

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[RangePartition]:
        starts, ends = flat(start), flat(end)
        for key, off in ends.items():  # a replayed batch after a restart: planned before this reader
            self._base[key] = max(self._base.get(key, 0), off)
        moved = sorted(
            (key, (starts.get(key, 0), off)) for key, off in ends.items() if off > starts.get(key, 0)
        )
        if not moved:
            return []
        from fanout_sink.kafka.topics import topic_ids

        ids = topic_ids(self.clients, {topic for (topic, _), _ in moved})
        return [RangePartition(t, p, s, e, ids.get(t)) for (t, p), (s, e) in moved]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, bytes]]:
        """The product's task on this range; one row: the slice's report, pickled. The batch id is
        unknown here (it only names a profile file): the range's start stands in for it."""
        assert isinstance(partition, RangePartition)
        from fanout_sink.protocol.slices import Slice
        from fanout_sink.spark.task import run_task

        planned = Slice(
            partition.topic, partition.partition, partition.start, partition.end, partition.topic_id
        )
        for report in run_task(self.setup, partition.start, {}, [[planned]]):
            yield partition.topic, partition.partition, pickle.dumps(report)


class RangeSource(DataSource):  # type: ignore[misc]
    """Options: ``config`` (the sink YAML's path), ``starting`` and ``until`` (offset JSON),
    ``maxOffsetsPerTrigger``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SUMMARY_SCHEMA

    def streamReader(self, schema: Any) -> RangeStreamReader:
        cap = self.options.get("maxOffsetsPerTrigger")
        until = self.options.get("until")
        return RangeStreamReader(
            self.options["config"],
            json.loads(self.options["starting"]),
            int(cap) if cap else None,
            json.loads(until) if until else None,
        )
