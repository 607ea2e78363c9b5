"""confluent-kafka clients as the sink configures them: shared properties, topics, transient errors.

Every client the sink creates (workers, the coordinator, the control reader, group-offset readers,
admin calls) starts from the user's ``kafka:`` section in librdkafka names. The helpers here are the
one place that knows which keys one client type must not get, which broker answers are worth
waiting out, and how the sink's own topics come into existence.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException

# Re-exported by confluent_kafka.admin without __all__, so strict mypy sees them as private.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
    TopicMetadata,
)
from confluent_kafka.cimpl import NewTopic

from fanout_sink.errors import TopicError

KafkaConf = Mapping[str, Any]
"""A ``kafka:`` section: librdkafka property names and values."""

DEFAULT_TIMEOUT_S = 30.0
_PRODUCER_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
log = logging.getLogger(__name__)
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


def pattern_topics(pattern: str, names: Iterable[str]) -> list[str]:
    """The topics among ``names`` that ``source.pattern`` subscribes to, sorted.

    Spark's ``subscribePattern`` hands the pattern to the Java consumer, which keeps a topic when
    ``Matcher.matches()``: the whole name must match (``re.fullmatch``, not ``re.match``), and leaves
    internal topics (``__consumer_offsets``, ``__transaction_state``) out.
    """
    rx = re.compile(pattern)
    return sorted(name for name in names if rx.fullmatch(name) and not name.startswith("__"))


LIBRDKAFKA_LOGGER = "fanout_sink.librdkafka"
"""The Python logger librdkafka's own lines go to, all at DEBUG."""


class _LibrdkafkaLog:
    """The ``logger`` every client gets: librdkafka's lines as DEBUG records of :data:`LIBRDKAFKA_LOGGER`.

    Without one, librdkafka writes to stderr itself, from its own threads, in its own format: a
    line per connection attempt while a broker is away. confluent-kafka hands each line to
    ``logger.log(level, "%s [%s] %s", facility, client, text)`` when the client is polled; what an
    operator needs of them (the broker is unreachable, then back) :class:`_Reachability` says once.
    """

    def __init__(self) -> None:
        self._logger = logging.getLogger(LIBRDKAFKA_LOGGER)

    def log(self, level: int, msg: str, *args: object) -> None:
        self._logger.debug(msg, *args)


class _Reachability:
    """One WARNING when a cluster becomes unreachable, one INFO when it answers again, per process.

    librdkafka reports "all brokers down" to every client's ``error_cb``, again after each failed
    reconnect, and late: a client polled after the cluster came back still serves the reports queued
    while it was away. So a report only starts a probe (metadata requests on a client of its own,
    one at a time per cluster): if the cluster does not answer it, the probe logs the WARNING, keeps
    asking, and logs the INFO when it answers, since librdkafka says nothing when it reconnects.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probing: set[str] = set()

    def error_cb(self, conf: dict[str, Any]) -> Callable[[KafkaError], None]:
        servers = str(conf.get("bootstrap.servers", ""))

        def on_error(error: KafkaError) -> None:
            log.debug("Kafka client error: %s", error.str())
            if error.code() != KafkaError._ALL_BROKERS_DOWN:
                return
            with self._lock:
                if servers in self._probing:
                    return
                self._probing.add(servers)
            threading.Thread(
                target=self._probe,
                args=(conf, servers, error.str()),
                name="fanout-sink-kafka-probe",
                daemon=True,
            ).start()

        return on_error

    def _probe(self, conf: dict[str, Any], servers: str, reason: str) -> None:
        since = time.monotonic()
        probe_conf: dict[str, Any] = {**conf, "logger": _LIBRDKAFKA_LOG}  # no error_cb: it is the watcher
        admin = AdminClient(probe_conf)
        attempts = 0
        while True:
            try:
                admin.list_topics(timeout=2.0)
                break
            except KafkaException:
                attempts += 1
                if attempts == 1:
                    log.warning(
                        "Kafka at %s is unreachable (%s); the sink keeps retrying and logs when it is "
                        "back (librdkafka's own lines: logger %s at DEBUG)",
                        servers,
                        reason,
                        LIBRDKAFKA_LOGGER,
                    )
                time.sleep(1.0)
        with self._lock:
            self._probing.discard(servers)
        if attempts:
            log.info("Kafka at %s is reachable again (after %.0f s)", servers, time.monotonic() - since)


_LIBRDKAFKA_LOG = _LibrdkafkaLog()
_REACHABILITY = _Reachability()


def client_conf(kafka_conf: KafkaConf) -> dict[str, Any]:
    """Client properties without consumer/producer-only keys that the other client type rejects, with
    the sink's ``logger`` and ``error_cb``: every client the sink creates starts from here, so
    librdkafka's lines go to Python logging at DEBUG and an unreachable cluster is logged once."""
    conf = {k: v for k, v in kafka_conf.items() if k not in {"group.id", "transactional.id"}}
    return {**conf, "logger": _LIBRDKAFKA_LOG, "error_cb": _REACHABILITY.error_cb(conf)}


PRODUCER_ONLY = frozenset(
    {
        "acks",
        "batch.num.messages",
        "batch.size",
        "compression.codec",
        "compression.level",
        "compression.type",
        "delivery.report.only.error",
        "delivery.timeout.ms",
        "enable.gapless.guarantee",
        "enable.idempotence",
        "linger.ms",
        "message.send.max.retries",
        "message.timeout.ms",
        "partitioner",
        "queue.buffering.backpressure.threshold",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "queuing.strategy",
        "request.required.acks",
        "request.timeout.ms",
        "retries",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
    }
)
"""librdkafka properties a consumer ignores with a CONFWARN line each time one is created (found by
creating a consumer with each); a ``kafka:`` section tuned for the workers' producers sets them."""


def consumer_conf(kafka_conf: KafkaConf) -> dict[str, Any]:
    """``client_conf`` without producer-only properties: a consumer created per process stays quiet."""
    return client_conf({k: v for k, v in kafka_conf.items() if k not in PRODUCER_ONLY})


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


def ensure_topic(
    kafka_conf: KafkaConf,
    topic: str,
    purpose: str,
    settings: TopicSettings,
    check: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TopicState:
    """Create ``topic`` (one partition, ``settings``) unless it exists, and describe it.

    The sink's own topics must exist before the first transaction writes to them: brokers usually
    refuse to auto-create topics, and a produce to a missing topic waits in the transaction until
    the commit times out, far from the cause. With ``check``, an existing topic replicated less
    than ``settings`` asks for is refused (``TopicError``) instead of silently weakening durability.
    """
    admin = AdminClient(client_conf(kafka_conf))
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
    deadline = time.monotonic() + timeout_s
    while (metadata is None or metadata.error is not None or not metadata.partitions) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
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
    described = _describe(admin, ConfigResource(ResourceType.TOPIC, topic), timeout_s) or {}
    return min(producer_limit, int(described.get("max.message.bytes", producer_limit)))
