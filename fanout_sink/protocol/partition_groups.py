"""Source partitions packed into partition groups: one Spark task and one transactional id per group.

In this module "group" is short for partition group (elsewhere a bare "group" is a Kafka consumer
group: the sink group, the coordinator group, the layout group).

A slice per partition cost a Spark task, a transaction and a transactional producer (with its
librdkafka threads) per source partition and batch: 1,000 one-partition topics meant 1,000 tasks
of ~0.6-0.9 s each, mostly waiting (issue 32). A group delivers the ranges of many partitions in one
task and one transaction under one transactional id, so what a batch costs follows the executors'
cores, not the partitions.

The grouping is stable: a partition lands in the same group from batch to batch as long as the group
count stays, because a transactional id fences only its own earlier holders (invariant I3). A new
count is a new layout with new ids; :mod:`.group_layout` fences the old layout's ids before the new
one delivers anything.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from fanout_sink.protocol.slices import Slice


@dataclass(frozen=True)
class PartitionGroups:
    """How source partitions map to groups.

    ``count`` groups; ``None`` is one group per partition, under the partition's own transactional
    id: what sinks did before packing, and what a tool or test that delivers one partition at a time
    from several processes at once needs (two partitions of one group delivered concurrently by two
    processes would fence each other).
    """

    count: int | None = None

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise ValueError(f"a layout needs at least one group, not {self.count}")

    def group_of(self, topic: str, partition: int) -> int:
        """The group of ``topic[partition]``: the topic's hash plus the partition, so one topic's
        partitions spread over consecutive groups and many one-partition topics spread by hash."""
        if self.count is None:
            raise ValueError("one group per partition: a partition has no group index")
        return (zlib.crc32(topic.encode()) + partition) % self.count

    def pack(self, slices: Iterable[Slice]) -> list[list[Slice]]:
        """The slices per group, groups in index order, each group's slices in the order given."""
        groups: dict[int | tuple[str, int], list[Slice]] = {}
        for planned in slices:
            key: int | tuple[str, int] = (
                (planned.topic, planned.partition)
                if self.count is None
                else self.group_of(planned.topic, planned.partition)
            )
            groups.setdefault(key, []).append(planned)
        return [groups[key] for key in sorted(groups)]  # all ints, or all (topic, partition) pairs

    def describe(self) -> str:
        return "one group per partition" if self.count is None else f"{self.count} partition group(s)"
