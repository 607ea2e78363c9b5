"""How the sink makes its Kafka clients: one factory, the only place that calls confluent-kafka's
constructors.

Every client the sink creates (workers' and the coordinator's transactional producers, the control
reader, group-offset readers, range readers, admin calls) starts from the user's ``kafka:`` section
in librdkafka names. :class:`KafkaClientFactory` is the one place that knows which keys one client
type must not get, which logger and error callback every client carries, and how long a call may
wait (the habit of Iceberg's Kafka Connect ``KafkaClientFactory`` and of quix-streams' single home
for clients): a new client kind is a new method here, not a constructor call in a protocol class.
``retry_transient`` says which broker answers are worth waiting out, for every call on them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

# Re-exported by confluent_kafka.admin without __all__, so strict mypy sees them as private.
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from fanout_sink.retries import Retry

KafkaConf = Mapping[str, Any]
"""A ``kafka:`` section: librdkafka property names and values."""

DEFAULT_TIMEOUT_S = 30.0
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


def _transient(exc: BaseException) -> bool:
    error = exc.args[0]
    return isinstance(error, KafkaError) and (error.code() in _TRANSIENT or error.retriable())


TRANSIENT_RETRY = Retry(
    deadline_s=DEFAULT_TIMEOUT_S, backoff_s=0.2, retry_on=(KafkaException,), retry_if=_transient
)
"""A broker call asked again every 0.2 s while its answer is transient, for ``timeout_s`` (30 s)."""


def retry_transient(call: Callable[[], _T], timeout_s: float = DEFAULT_TIMEOUT_S) -> _T:
    """Run ``call`` again while the broker answers with a transient error (a group coordinator that
    is still loading, a pending transactional offset commit), up to ``timeout_s``."""
    return dataclasses.replace(TRANSIENT_RETRY, deadline_s=timeout_s).run(call)


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


PROBE_RETRY = Retry(backoff_s=1.0)
"""An unreachable cluster's probe asks for its metadata (2 s per try) every second until it answers."""


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
        tries = PROBE_RETRY.start()
        while True:
            try:
                admin.list_topics(timeout=2.0)
                break
            except KafkaException:
                if tries.number == 1:
                    log.warning(
                        "Kafka at %s is unreachable (%s); the sink keeps retrying and logs when it is "
                        "back (librdkafka's own lines: logger %s at DEBUG)",
                        servers,
                        reason,
                        LIBRDKAFKA_LOGGER,
                    )
                tries.again()  # no count, no deadline: always another
        with self._lock:
            self._probing.discard(servers)
        if tries.number > 1:
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
class KafkaClientFactory:
    """Makes every Kafka client of the sink from one ``kafka:`` section and one call timeout.

    Frozen and plain data, so it travels to Spark executors inside a ``SinkChannel``. Each method
    builds the client's properties from :func:`client_conf` (consumers from :func:`consumer_conf`),
    then the caller's ``settings`` on top: what the client kind needs (a group id, an isolation
    level) always wins over the user's section, and ``defaults`` (fetch sizes, a transaction
    timeout) lose to it.
    """

    conf: KafkaConf = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def consumer(self, settings: KafkaConf, defaults: KafkaConf | None = None) -> Consumer:
        """A consumer; callers assign it partitions, never subscribe (no sink process joins a group)."""
        return Consumer({**(defaults or {}), **consumer_conf(self.conf), **settings})

    def producer(self, settings: KafkaConf, defaults: KafkaConf | None = None) -> Producer:
        return Producer({**(defaults or {}), **client_conf(self.conf), **settings})

    def admin(self, settings: KafkaConf | None = None) -> AdminClient:
        return AdminClient({**client_conf(self.conf), **(settings or {})})

    def group_metadata(self, group: str) -> bytes:
        """Group metadata of a consumer that never subscribes: generation -1, plain bytes (shippable).

        The broker accepts transactional offset commits with generation -1 only while the group has
        no members, which is why no process may ever join the sink-managed group.
        """
        holder = self.consumer({"group.id": group})
        try:
            metadata: bytes = holder.consumer_group_metadata()
        finally:
            holder.close()
        return metadata
