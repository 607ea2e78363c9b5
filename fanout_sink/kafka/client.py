"""confluent-kafka clients as the sink configures them: shared properties, topics, transient errors.

Every client the sink creates (workers, the coordinator, the control reader, group-offset readers,
admin calls) starts from the user's ``kafka:`` section in librdkafka names. The helpers here are the
one place that knows which keys one client type must not get, which broker answers are worth
waiting out, and how the sink's own topics come into existence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # admin re-exports it, untyped
from confluent_kafka.cimpl import NewTopic

from fanout_sink.errors import TopicError

KafkaConf = Mapping[str, Any]
"""A ``kafka:`` section: librdkafka property names and values."""

DEFAULT_TIMEOUT_S = 30.0
_PRODUCER_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
_T = TypeVar("_T")
_TRANSIENT = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNSTABLE_OFFSET_COMMIT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.NOT_LEADER_FOR_PARTITION,  # a just-created topic, before its leader is ready
    KafkaError.LEADER_NOT_AVAILABLE,
}


def retry_transient(call: Callable[[], _T], timeout_s: float = DEFAULT_TIMEOUT_S) -> _T:
    """Run ``call`` again while the broker answers with a transient error (a group coordinator that
    is still loading, a pending transactional offset commit), up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            transient = isinstance(error, KafkaError) and (error.code() in _TRANSIENT or error.retriable())
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def client_conf(kafka_conf: KafkaConf) -> dict[str, Any]:
    """Client properties without consumer/producer-only keys that the other client type rejects."""
    return {k: v for k, v in kafka_conf.items() if k not in {"group.id", "transactional.id"}}


def ensure_topic(
    kafka_conf: KafkaConf, topic: str, purpose: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    """Create ``topic`` (one partition) unless it exists; its partition count once it has a leader.

    The sink's own topics must exist before the first transaction writes to them: brokers usually
    refuse to auto-create topics, and a produce to a missing topic waits in the transaction until
    the commit times out, far from the cause.
    """
    admin = AdminClient(client_conf(kafka_conf))
    metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        futures = admin.create_topics([NewTopic(topic, num_partitions=1)], operation_timeout=timeout_s)
        try:
            futures[topic].result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(
                    f"could not create {purpose} {topic!r}: {exc.args[0].str()}\n"
                    "  fix: create it by hand, or grant the sink CREATE on the cluster."
                ) from exc
    # A topic just created (by us or a concurrent process) shows no partitions until a leader is elected.
    deadline = time.monotonic() + timeout_s
    while (metadata is None or metadata.error is not None or not metadata.partitions) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
        metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    return len(metadata.partitions) if metadata is not None else 0


def memberless_group_metadata(kafka_conf: KafkaConf, group: str) -> bytes:
    """Group metadata of a consumer that never subscribes: generation -1, plain bytes (shippable).

    The broker accepts transactional offset commits with generation -1 only while the group has no
    members, which is why no process may ever join the sink-managed group.
    """
    holder = Consumer({**client_conf(kafka_conf), "group.id": group})
    try:
        metadata: bytes = holder.consumer_group_metadata()
    finally:
        holder.close()
    return metadata


def max_message_bytes(kafka_conf: KafkaConf, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """The largest message the sink may produce to ``topic``: the smaller of the producer's
    ``message.max.bytes`` (librdkafka refuses larger ones at ``produce``) and the topic's
    ``max.message.bytes`` (the broker refuses larger batches, failing the whole transaction)."""
    producer_limit = int(kafka_conf.get("message.max.bytes", _PRODUCER_MESSAGE_MAX_BYTES))
    admin = AdminClient(client_conf(kafka_conf))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=timeout_s)[resource]
    configs = described.result(timeout=timeout_s)
    entry = configs.get("max.message.bytes")
    topic_limit = int(entry.value) if entry is not None and entry.value is not None else producer_limit
    return min(producer_limit, topic_limit)
