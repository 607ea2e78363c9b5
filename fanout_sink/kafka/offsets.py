"""Where each source partition stands: delivered (the sink-managed group) versus available (its end).

The worker needs the committed offset to skip or refuse a slice; the coordinator needs both numbers
to decide whether a partition that reported nothing is caught up or holding VTTS back; ``status``
shows them as lag. One implementation keeps the three agreeing.
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

# Re-exported by confluent_kafka.admin without __all__, so strict mypy sees them as private.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from fanout_sink.kafka.clients import KafkaClientFactory, retry_transient
from fanout_sink.kafka.topics import pattern_topics

log = logging.getLogger(__name__)


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


class GroupOffsets:
    """Reads a group's committed offsets through a consumer that never subscribes (never joins).

    ``stable`` sets ``isolation.level=read_committed``, which makes librdkafka ask the broker for
    stable offsets only (``require_stable``: it waits while a transaction has an offset commit
    pending). A worker needs that: it must see what a fenced attempt finally did. The coordinator and
    ``status`` must not wait, or a round would stall behind a worker's open transaction.

    (AdminClient.list_consumer_group_offsets would do too, but confluent-kafka 2.16.1 segfaults in it
    when the broker answers the first request with COORDINATOR_LOAD_IN_PROGRESS.)
    """

    def __init__(self, clients: KafkaClientFactory, group: str, stable: bool = True) -> None:
        self.group = group
        self.timeout_s = clients.timeout_s
        isolation = "read_committed" if stable else "read_uncommitted"
        self._consumer = clients.consumer(
            {"group.id": group, "isolation.level": isolation, "enable.auto.commit": False}
        )

    def committed(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        return {key: offset for key, (offset, _) in self.committed_with_metadata(partitions).items()}

    def committed_with_metadata(
        self, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int | None, str]]:
        """Each partition's committed offset and the offset metadata string committed with it ("" if none)."""
        timeout_s = self.timeout_s

        def ask() -> dict[tuple[str, int], tuple[int | None, str]]:
            found: dict[tuple[str, int], tuple[int | None, str]] = {}
            answer = self._consumer.committed(
                [TopicPartition(t, p) for t, p in partitions], timeout=timeout_s
            )
            for tp in answer:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                offset = int(tp.offset) if tp.offset >= 0 else None
                found[(tp.topic, tp.partition)] = (offset, tp.metadata or "")
            return found

        return retry_transient(ask, timeout_s)

    def close(self) -> None:
        self._consumer.close()


def source_positions(
    clients: KafkaClientFactory, group: str, topics: list[str], pattern: str | None = None
) -> list[PartitionPosition]:
    """Committed (by ``group``, not waiting for open transactions) and last stable offset of every
    partition of ``topics`` and of the topics ``pattern`` (``source.pattern``) matches now.

    Every commit round calls this (and the lag metric comes from it), so the ends are one batched
    ``ListOffsets`` per partition leader, not one request per partition. The pattern is matched
    against the metadata that call needs anyway, so a topic created while the sink runs (a new
    table in a replicated database) holds VTTS back and shows its lag from the first round after
    its creation, as Spark's ``subscribePattern`` starts reading it.
    """
    admin, timeout_s = clients.admin(), clients.timeout_s
    listed = admin.list_topics(timeout=timeout_s).topics
    if pattern is not None:
        topics = sorted({*topics, *pattern_topics(pattern, listed)})
    partitions = [(t, p) for t in topics if t in listed for p in sorted(listed[t].partitions)]
    if not partitions:
        return []
    asked = admin.list_offsets(
        {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions},  # type: ignore[no-untyped-call]
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=timeout_s,
    )
    try:
        ends = {
            (tp.topic, tp.partition): int(future.result(timeout_s).offset) for tp, future in asked.items()
        }
    except concurrent.futures.TimeoutError as exc:  # not the builtin TimeoutError before Python 3.11
        raise TimeoutError(f"no last stable offsets of {topics} within {timeout_s:.0f} s") from exc
    reader = GroupOffsets(clients, group, stable=False)
    try:
        committed = reader.committed(partitions)
    finally:
        reader.close()
    return [PartitionPosition(t, p, committed.get((t, p)), ends[(t, p)]) for t, p in partitions]


def log_start_offset(clients: KafkaClientFactory, topic: str, partition: int) -> int:
    """The partition's log start offset: the oldest offset a consumer can still read."""
    admin, timeout_s, tp = clients.admin(), clients.timeout_s, TopicPartition(topic, partition)
    asked = admin.list_offsets(  # the admin is referenced until its future resolves
        {tp: OffsetSpec.earliest()},  # type: ignore[no-untyped-call]
        request_timeout=timeout_s,
    )
    try:
        return int(asked[tp].result(timeout_s).offset)
    except concurrent.futures.TimeoutError as exc:
        raise TimeoutError(f"no log start offset of {topic}[{partition}] within {timeout_s:.0f} s") from exc


DEFAULT_OFFSETS_RETENTION_S = 7 * 24 * 3600.0
"""Kafka's default ``offsets.retention.minutes`` (7 days), used when the broker will not say."""


def offsets_retention_s(clients: KafkaClientFactory) -> float:
    """The broker's ``offsets.retention.minutes`` in seconds: how long a group that nobody joins keeps
    a partition's committed offset after its last commit."""
    admin, timeout_s = clients.admin(), clients.timeout_s
    try:
        brokers = sorted(admin.list_topics(timeout=timeout_s).brokers)
        resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
        value = entries["offsets.retention.minutes"].value
    except (KafkaException, IndexError, KeyError) as exc:
        log.warning(
            "could not read the broker's offsets.retention.minutes (%s); assuming Kafka's default, 7 days",
            exc,
        )
        return DEFAULT_OFFSETS_RETENTION_S
    return float(value) * 60 if value is not None else DEFAULT_OFFSETS_RETENTION_S
