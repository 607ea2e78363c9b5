"""The sink's own topics (control, dead letters): created with the durability of the source offsets,
or checked; which topics a pattern subscribes to; how large a message a topic takes; which topic id
a source topic has now."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaError, KafkaException, TopicCollection

# Re-exported by confluent_kafka.admin without __all__, so strict mypy sees them as private.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
    TopicMetadata,
)
from confluent_kafka.cimpl import NewTopic

from fanout_sink.errors import TopicError
from fanout_sink.kafka.clients import KafkaClientFactory, retry_transient
from fanout_sink.retries import Retry

_PRODUCER_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
log = logging.getLogger(__name__)


def pattern_topics(pattern: str, names: Iterable[str]) -> list[str]:
    """The topics among ``names`` that ``source.pattern`` subscribes to, sorted.

    Spark's ``subscribePattern`` hands the pattern to the Java consumer, which keeps a topic when
    ``Matcher.matches()``: the whole name must match (``re.fullmatch``, not ``re.match``), and leaves
    internal topics (``__consumer_offsets``, ``__transaction_state``) out.
    """
    rx = re.compile(pattern)
    return sorted(name for name in names if rx.fullmatch(name) and not name.startswith("__"))


@dataclass(frozen=True)
class TopicSettings:
    """How the sink creates one of its own topics, and what an existing one must at least have.

    Unset ``replication_factor``/``min_insync_replicas`` mean "as durable as the source offsets":
    the broker's ``offsets.topic.replication.factor`` and ``transaction.state.log.min.isr``, capped
    at the number of brokers. Control events and dead letters are committed in the same
    transactions as the source offsets, so a topic replicated less than ``__consumer_offsets``
    would be the one that loses what the offsets say was delivered.
    """

    section: str
    """The YAML section that configures the topic (named in errors)."""
    config: Mapping[str, str] = field(default_factory=dict)
    """Topic properties (Kafka names) set at creation, e.g. ``retention.ms``."""
    replication_factor: int | None = None
    min_insync_replicas: int | None = None


@dataclass(frozen=True)
class TopicState:
    """An ensured topic as the broker describes it."""

    partitions: int
    created: bool
    config: Mapping[str, str]
    """The topic's effective properties (empty unless checked, or if the broker would not describe them)."""


LEADER_WAIT = Retry(backoff_s=0.1)
"""A topic just created shows no partitions until a leader is elected: :func:`ensure_topic` asks for
its metadata again every 0.1 s, for the clients' timeout."""


def ensure_topic(
    clients: KafkaClientFactory, topic: str, purpose: str, settings: TopicSettings, check: bool = True
) -> TopicState:
    """Create ``topic`` (one partition, ``settings``) unless it exists, and describe it.

    The sink's own topics must exist before the first transaction writes to them: brokers usually
    refuse to auto-create topics, and a produce to a missing topic waits in the transaction until
    the commit times out, far from the cause. With ``check``, an existing topic replicated less
    than ``settings`` asks for is refused (``TopicError``) instead of silently weakening durability.
    """
    admin, timeout_s = clients.admin(), clients.timeout_s
    cluster = admin.list_topics(topic=topic, timeout=timeout_s)
    metadata = cluster.topics.get(topic)
    created = metadata is None or metadata.error is not None
    replication, min_isr = (None, None)
    if created or check:
        replication, min_isr = _required_replication(admin, settings, sorted(cluster.brokers), timeout_s)
    if created:
        config = dict(settings.config)
        if min_isr is not None:
            config["min.insync.replicas"] = str(min_isr)
        new = NewTopic(topic, num_partitions=1, replication_factor=replication or -1, config=config)
        futures = admin.create_topics([new], operation_timeout=timeout_s)
        try:
            futures[topic].result(timeout=timeout_s)
            log.info("created %s %r: replication factor %s, %s", purpose, topic, replication, config)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(
                    f"could not create {purpose} {topic!r} (replication factor {replication}, {config}): "
                    f"{exc.args[0].str()}\n"
                    f"  fix: create it by hand, or grant the sink CREATE on the cluster; "
                    f"{settings.section}.replication-factor and .min-insync-replicas set the replication."
                ) from exc
    # A topic just created (by us or a concurrent process) shows no partitions until a leader is elected.
    tries = replace(LEADER_WAIT, deadline_s=timeout_s).start()
    while (metadata is None or metadata.error is not None or not metadata.partitions) and tries.again():
        metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    described = _describe(admin, ConfigResource(ResourceType.TOPIC, topic), timeout_s) if check else None
    if check and not created and metadata is not None:
        _check_replication(topic, purpose, settings, metadata, described, replication, min_isr)
    return TopicState(
        partitions=len(metadata.partitions) if metadata is not None else 0,
        created=created,
        config=described or {},
    )


def _describe(admin: AdminClient, resource: ConfigResource, timeout_s: float) -> dict[str, str] | None:
    """A broker's or topic's effective configuration; None (with a warning) when it may not be read."""
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except KafkaException as exc:
        log.warning("could not describe %s: %s; its settings are not checked", resource, exc.args[0].str())
        return None
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def _required_replication(
    admin: AdminClient, settings: TopicSettings, brokers: list[int], timeout_s: float
) -> tuple[int | None, int | None]:
    """Replication factor and ``min.insync.replicas`` the topic needs: the configured ones, else the
    durability the broker gives consumer offsets and transaction state (capped at the brokers
    there are). None where neither is known (the broker's default applies)."""
    replication, min_isr = settings.replication_factor, settings.min_insync_replicas
    if (replication is None or min_isr is None) and brokers:
        broker = _describe(admin, ConfigResource(ResourceType.BROKER, str(brokers[0])), timeout_s) or {}
        if replication is None and "offsets.topic.replication.factor" in broker:
            replication = min(int(broker["offsets.topic.replication.factor"]), len(brokers))
        if min_isr is None and "transaction.state.log.min.isr" in broker:
            min_isr = min(int(broker["transaction.state.log.min.isr"]), replication or len(brokers))
    return replication, min_isr


def _check_replication(
    topic: str,
    purpose: str,
    settings: TopicSettings,
    metadata: TopicMetadata,
    described: Mapping[str, str] | None,
    replication: int | None,
    min_isr: int | None,
) -> None:
    problems: list[str] = []
    fixes: list[str] = []
    actual_replication = min((len(p.replicas) for p in metadata.partitions.values()), default=0)
    if replication is not None and actual_replication < replication:
        problems.append(f"replication factor {actual_replication} < {replication}")
        fixes.append(
            f"add replicas with kafka-reassign-partitions, or accept it with "
            f"{settings.section}.replication-factor: {actual_replication}"
        )
    actual_min_isr = (described or {}).get("min.insync.replicas")
    if min_isr is not None and actual_min_isr is not None and int(actual_min_isr) < min_isr:
        problems.append(f"min.insync.replicas {actual_min_isr} < {min_isr}")
        fixes.append(
            f"kafka-configs --alter --entity-type topics --entity-name {topic} "
            f"--add-config min.insync.replicas={min_isr}, or accept it with "
            f"{settings.section}.min-insync-replicas: {actual_min_isr}"
        )
    if problems:
        raise TopicError(
            f"{purpose} {topic!r} is less durable than the source offsets committed with it: "
            f"{', '.join(problems)}; losing a broker could lose what the offsets say was delivered.\n"
            f"  fix: {'; '.join(fixes)}"
        )


def max_message_bytes(clients: KafkaClientFactory, topic: str) -> int:
    """The largest message the sink may produce to ``topic``: the smaller of the producer's
    ``message.max.bytes`` (librdkafka refuses larger ones at ``produce``) and the topic's
    ``max.message.bytes`` (the broker refuses larger batches, failing the whole transaction)."""
    producer_limit = int(clients.conf.get("message.max.bytes", _PRODUCER_MESSAGE_MAX_BYTES))
    described = _describe(clients.admin(), ConfigResource(ResourceType.TOPIC, topic), clients.timeout_s) or {}
    return min(producer_limit, int(described.get("max.message.bytes", producer_limit)))


def topic_ids(clients: KafkaClientFactory, topics: Iterable[str]) -> dict[str, str]:
    """The topic id of each of ``topics`` that exists (Kafka's base64 form, as ``kafka-topics
    --describe`` prints it); a topic that does not exist is left out.

    A name is not an identity: a topic deleted and created again keeps its name and gets a new id,
    and its offsets start over. Every delivered position the sink records carries the id, so a
    position of the old topic is never taken for one of the new topic.
    """
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin, timeout_s = clients.admin(), clients.timeout_s

    def describe() -> dict[str, str]:
        found: dict[str, str] = {}
        futures = admin.describe_topics(TopicCollection(wanted), request_timeout=timeout_s)
        for topic, future in futures.items():
            try:
                found[topic] = str(future.result(timeout_s).topic_id)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
        return found

    return retry_transient(describe, timeout_s)
