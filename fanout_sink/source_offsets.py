"""Where each source partition stands: delivered (the sink-managed group) versus available (its end).

The worker needs the committed offset to skip or refuse a slice; the coordinator needs both numbers
to decide whether a partition that reported nothing is caught up or holding VTTS back; ``status``
shows them as lag. One implementation keeps the three agreeing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from fanout_sink import channel


@dataclass(frozen=True)
class PartitionPosition:
    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.committed or 0))

    @property
    def caught_up(self) -> bool:
        return self.committed is not None and self.committed >= self.end


def committed_offset(
    admin: AdminClient, group: str, topic: str, partition: int, timeout_s: float = channel.DEFAULT_TIMEOUT_S
) -> int | None:
    """The group's committed offset for one partition, waiting for pending transactional commits."""
    return committed_offsets(admin, group, [(topic, partition)], timeout_s)[(topic, partition)]


def committed_offsets(
    admin: AdminClient,
    group: str,
    partitions: list[tuple[str, int]],
    timeout_s: float = channel.DEFAULT_TIMEOUT_S,
    stable: bool = True,
) -> dict[tuple[str, int], int | None]:
    """Committed offsets of many partitions at once.

    ``stable`` (``require_stable``) waits until no transaction has an offset commit pending: a worker
    needs that (it must see what the fenced attempt finally did); the coordinator and ``status`` must
    not, or a round would wait for a worker's open transaction.
    """

    def ask() -> dict[tuple[str, int], int | None]:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in partitions])
        futures = admin.list_consumer_group_offsets(
            [request], require_stable=stable, request_timeout=timeout_s
        )
        result = futures[group].result(timeout=timeout_s)
        found: dict[tuple[str, int], int | None] = {}
        for tp in result.topic_partitions:
            if tp.error is not None:
                raise KafkaException(tp.error)
            found[(tp.topic, tp.partition)] = int(tp.offset) if tp.offset >= 0 else None
        return found

    return channel.retry_transient(ask, timeout_s)


def source_positions(
    kafka_conf: dict[str, Any], sink: str, topics: list[str], timeout_s: float = channel.DEFAULT_TIMEOUT_S
) -> list[PartitionPosition]:
    """Committed (sink-managed group) and last stable offset of every partition of ``topics``."""
    conf = channel._client_conf(kafka_conf)
    consumer = Consumer({**conf, "group.id": channel.sink_group(sink), "isolation.level": "read_committed"})
    try:
        metadata = consumer.list_topics(timeout=timeout_s).topics
        partitions = [(t, p) for t in topics if t in metadata for p in sorted(metadata[t].partitions)]
        ends = {
            (t, p): int(
                consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout_s, cached=False)[1]
            )
            for t, p in partitions
        }
    finally:
        consumer.close()
    if not partitions:
        return []
    committed = committed_offsets(
        AdminClient(conf), channel.sink_group(sink), partitions, timeout_s, stable=False
    )
    return [PartitionPosition(t, p, committed.get((t, p)), ends[(t, p)]) for t, p in partitions]
