"""Partition groups: which partitions share a task and a transactional id (pure, no broker)."""

from __future__ import annotations

from collections import Counter

import pytest

from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice


def test_a_partition_keeps_its_group_from_batch_to_batch_whichever_partitions_moved() -> None:
    groups = PartitionGroups(3)
    everything = [Slice("orders", p, 0, 10) for p in range(9)]
    packed = groups.pack(everything)
    assert [len(g) for g in packed] == [3, 3, 3]  # one topic's partitions spread evenly
    first = {(s.topic, s.partition): i for i, group in enumerate(packed) for s in group}
    some = [s for s in everything if s.partition % 2]
    for group in groups.pack(some):  # fewer partitions moved: each still lands in its first group
        assert {first[(s.topic, s.partition)] for s in group} == {
            groups.group_of(group[0].topic, group[0].partition)
        }


def test_many_one_partition_topics_spread_over_the_groups() -> None:
    """A whole database's Debezium topics: one partition each, spread by the topic's hash."""
    groups = PartitionGroups(4)
    sizes = Counter(groups.group_of(f"db.inventory.table_{i}", 0) for i in range(1000))
    assert set(sizes) == {0, 1, 2, 3}
    assert min(sizes.values()) >= 200, sizes


def test_without_a_count_every_partition_is_its_own_group_under_its_own_id() -> None:
    channel = SinkChannel("s", {}, "s-control")
    slices = [Slice("t", p, 0, 5) for p in range(3)]
    assert channel.partition_groups.pack(slices) == [[s] for s in slices]
    assert channel.worker_transactional_id("t", 1) == "fanout-sink:s:t:1"
    packed = SinkChannel("s", {}, "s-control", partition_groups=PartitionGroups(2))
    ids = {packed.worker_transactional_id("t", p) for p in range(10)}
    assert ids == {"fanout-sink:s:groups:2:0", "fanout-sink:s:groups:2:1"}
    with pytest.raises(ValueError):
        PartitionGroups(0)
