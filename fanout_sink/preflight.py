"""Checks run before the sink starts anything: broker, credentials, topics, catalog, warehouse.

Without them, a wrong setting surfaces late and far from its cause: an unreachable broker as
hundreds of librdkafka lines and a traceback after 30 s, a wrong SASL password as "Broker transport
failure", a missing source topic only after the control topic was created, a catalog without a URI
after Spark started, with PyIceberg's advice to pass a ``--uri`` flag the CLI does not have. Each
check here is quick, creates nothing (topic creation is only validated by the broker), names the
YAML key involved and reports a :class:`Finding`: a problem (one cause line, one fix line), a warning,
or what it found fine. A broker that cannot be reached or refuses us raises :class:`PreflightError`
at once: every later Kafka check would only repeat it.

The librdkafka client used here has an ``error_cb`` of its own (and ``client_conf``'s logger, so
nothing it says reaches the terminal raw); its errors are turned into the cause line instead.

:data:`CHECKS` is the ordered list of named checks. :func:`run` (before ``fanout-sink run``) stops at
the first problem and logs warnings; ``fanout-sink validate`` (:mod:`fanout_sink.validate`) runs
every check with ``dry_run`` and reports every finding. With ``dry_run`` nothing at all is created:
no catalog file or catalog tables, no folder (``run`` creates those when it starts).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata  # admin re-exports it, untyped
from confluent_kafka.cimpl import NewTopic

from fanout_sink.catalog import load_catalog, local_warehouse_path, sqlite_path
from fanout_sink.catalog_errors import check_settings, unreachable
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import CatalogSettingsError, PreflightError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.retries import Retry

log = logging.getLogger("fanout_sink.preflight")

BROKER_TIMEOUT_S = 10.0
"""How long the broker may take to answer at all; a healthy one answers in milliseconds."""

_SERVERS = 'kafka."bootstrap.servers"'
_GIVE_UP = {KafkaError._AUTHENTICATION, KafkaError._ALL_BROKERS_DOWN, KafkaError._SSL}
_TLS_ALERT = "ssl/tls alert"  # OpenSSL's text for an alert the peer sent


@dataclass(frozen=True)
class Finding:
    """One result of a check. ``problem``: the sink would not start (``text`` is the cause line,
    naming the YAML key, ``fix`` what to change); ``warning``: it starts, but probably not as meant;
    ``ok``: what was checked and found fine (``validate``'s summary)."""

    level: Literal["problem", "warning", "ok"]
    text: str
    fix: str = ""

    @classmethod
    def of(cls, error: PreflightError) -> Finding:
        return cls("problem", error.cause, error.fix)


class Preflight:
    """The state the checks share: the config, one quiet admin client, the cluster's metadata, the
    catalog once it answered (``None``: not loaded, or with ``dry_run`` not created yet)."""

    def __init__(
        self, config: SinkConfig, broker_timeout_s: float = BROKER_TIMEOUT_S, dry_run: bool = False
    ) -> None:
        self.config = config
        self.broker_timeout_s = broker_timeout_s
        self.dry_run = dry_run
        self.errors: list[KafkaError] = []
        self.catalog: Any = None
        self._admin: AdminClient | None = None
        self._metadata: ClusterMetadata | None = None
        self._broker_error: PreflightError | None = None

    @property
    def servers(self) -> str:
        return self.config.kafka.get("bootstrap.servers", "")

    def admin(self) -> AdminClient:
        if self._admin is None:
            try:
                # error_cb instead of client_conf's: errors become the cause line.
                self._admin = KafkaClientFactory(self.config.kafka).admin({"error_cb": self.errors.append})
            except KafkaException as exc:
                raise PreflightError(
                    f"the kafka: section is not a valid librdkafka configuration: {exc.args[0].str()}",
                    "correct or remove that property (names as in librdkafka's CONFIGURATION.md)",
                ) from None
        return self._admin

    def metadata(self) -> ClusterMetadata:
        """The cluster's topics; raises as soon as the broker is known unreachable or refuses us."""
        if self._metadata is not None:
            return self._metadata
        if self._broker_error is not None:  # known: asking again would only wait as long again
            raise self._broker_error
        admin = self.admin()
        tries = Retry(deadline_s=self.broker_timeout_s).start()  # each try waits 1 s for its answer
        while True:
            try:
                self._metadata = admin.list_topics(timeout=1.0)
                return self._metadata
            except KafkaException:
                admin.poll(0)  # serves error_cb
            if any(e.code() in _GIVE_UP for e in self.errors) or not tries.again():
                self._broker_error = self._broker_failure()
                raise self._broker_error

    def _broker_failure(self) -> PreflightError:
        kafka = self.config.kafka
        auth = next((e for e in self.errors if e.code() == KafkaError._AUTHENTICATION), None)
        if auth is not None:
            user = kafka.get("sasl.username", "")
            mechanism = kafka.get("sasl.mechanism") or kafka.get("sasl.mechanisms") or "GSSAPI"
            return PreflightError(
                f"Kafka at {_SERVERS}={self.servers} refused the credentials (authentication failed) of "
                f'kafka."sasl.username"={user!r} with SASL {mechanism}: {_reason(auth)}',
                'correct kafka."sasl.username" / kafka."sasl.password" (or the environment variable '
                'they come from) and kafka."sasl.mechanism"',
            )
        # A broker that rejects the client's certificate answers with a TLS alert: a transport error.
        tls = next((e for e in self.errors if e.code() == KafkaError._SSL or _TLS_ALERT in e.str()), None)
        if tls is not None:
            return PreflightError(
                f"Kafka at {_SERVERS}={self.servers} failed the TLS handshake: {_reason(tls)}",
                'give in kafka."ssl.ca.location" the CA that signed the broker\'s certificate, and as '
                'kafka."ssl.certificate.location"/"ssl.key.location" a client certificate the broker trusts',
            )
        if not self.servers:
            return PreflightError(f"{_SERVERS} is not set", f"set {_SERVERS}, e.g. 127.0.0.1:9092")
        transport = next((e for e in self.errors if e.code() != KafkaError._ALL_BROKERS_DOWN), None)
        silent = f"no answer within {self.broker_timeout_s:.0f}s"
        detail = _reason(transport) if transport is not None else silent
        return PreflightError(
            f"Kafka at {_SERVERS}={self.servers} is unreachable: {detail}",
            f"start the broker or correct {_SERVERS}; a TLS or SASL listener also needs "
            'kafka."security.protocol"',
        )


def _reason(error: KafkaError) -> str:
    """librdkafka's message without the ``host:port/id: `` prefix and the state suffix."""
    text = str(error.str())
    head, sep, tail = text.partition(": ")
    if sep and "/" in head:
        text = tail
    return text.split(" (after ", 1)[0]


def check_broker(pre: Preflight) -> Iterator[Finding]:
    """The broker answers, and accepts the credentials."""
    brokers = len(pre.metadata().brokers)
    yield Finding("ok", f"Kafka at {pre.servers} answers ({brokers} broker{'s' if brokers != 1 else ''})")


def check_source_topics(pre: Preflight) -> Iterator[Finding]:
    """Every topic in ``source.topics`` exists; a ``source.pattern`` matching nothing is only a warning."""
    topics = pre.metadata().topics
    source = pre.config.source
    if source.pattern is not None:
        # Spark subscribes with Java's Matcher.matches(): the whole name must match.
        matched = sorted(name for name in topics if re.fullmatch(source.pattern, name))
        if not matched:
            yield Finding(
                "warning",
                f"source.pattern {source.pattern!r} matches no topic on {pre.servers} yet; the sink starts "
                "and waits for one",
                "create a topic the pattern matches (Java regex, whole name), or correct source.pattern",
            )
        else:
            yield Finding("ok", f"source.pattern {source.pattern!r} matches {', '.join(matched)}")
        return
    missing = [t for t in source.topics if t not in topics or topics[t].error is not None]
    if missing:
        names = ", ".join(repr(t) for t in missing)
        yield Finding(
            "problem",
            f"source.topics: {names} {'does' if len(missing) == 1 else 'do'} not exist on {_SERVERS}="
            f"{pre.servers} (or the sink may not describe {'it' if len(missing) == 1 else 'them'})",
            "create the topic(s), correct source.topics, or grant the sink DESCRIBE and READ on them",
        )
    else:
        yield Finding("ok", f"source.topics exist: {', '.join(source.topics)}")


def check_sink_topics(pre: Preflight) -> Iterator[Finding]:
    """The control and dead-letter topics exist in a usable shape, or the broker would let the sink
    create them (``validate_only``: nothing is created here)."""
    topics = pre.metadata().topics
    config = pre.config
    wanted = [("control.topic", config.control_topic, 1, config.control.topic_settings())]
    if config.dead_letter is not None:
        wanted.append(("dead-letter.topic", config.dead_letter.topic, 0, config.dead_letter.topic_settings()))
    for key, topic, partitions, settings in wanted:
        existing = topics.get(topic)
        if existing is not None and existing.error is None:
            if partitions and len(existing.partitions) != partitions:
                yield Finding(
                    "problem",
                    f"{key}: topic {topic!r} has {len(existing.partitions)} partitions; the control topic "
                    "needs exactly 1 so that control offsets are one total order",
                    f"point {key} at a new name (the sink creates it), or recreate it with 1 partition",
                )
            else:
                yield Finding("ok", f"{key} {topic!r} exists")
            continue
        future = pre.admin().create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=1,
                    replication_factor=settings.replication_factor or -1,
                    config=dict(settings.config),
                )
            ],
            validate_only=True,
            request_timeout=pre.broker_timeout_s,
        )[topic]
        try:
            future.result(timeout=pre.broker_timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                yield Finding("ok", f"{key} {topic!r} exists")
                continue
            yield Finding(
                "problem",
                f"{key}: the sink could not create topic {topic!r}: {exc.args[0].str()}",
                f"create {topic!r} by hand (1 partition), grant the sink CREATE on the cluster, or "
                f"change {settings.section}.replication-factor",
            )
            continue
        yield Finding("ok", f"{key} {topic!r} does not exist yet; the broker lets the sink create it")


def check_warehouse(pre: Preflight) -> Iterator[Finding]:
    """A local warehouse folder can be written: a probe file is created and deleted in it, or in its
    nearest existing parent when the folder is not there yet (the sink creates it; this check does not)."""
    warehouse = pre.config.catalog.warehouse
    path = local_warehouse_path(pre.config.catalog)
    if path is None:
        # Object stores are checked by the first write; a probe there costs a request and money.
        # A REST catalog's warehouse name is the server's to resolve.
        yield Finding("ok", f"catalog.warehouse {warehouse or '(the catalog decides)'}: not probed")
        return
    folder = path.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    probe = folder / f".fanout-sink-preflight-{uuid.uuid4().hex[:8]}"
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, f"{folder} is a file, not a folder")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        yield Finding(
            "problem",
            f"catalog.warehouse: cannot write to {path}: {exc.strerror or exc}",
            "point catalog.warehouse at a folder the sink may write, or fix that folder's permissions",
        )
        return
    yield Finding("ok", f"catalog.warehouse {path} is writable")


def check_catalog(pre: Preflight) -> Iterator[Finding]:
    """The catalog answers: its namespaces can be listed. With ``dry_run``, a SQLite catalog file that
    does not exist yet is not created (``run`` creates it), nor are a SQL catalog's own tables."""
    settings = pre.config.catalog
    try:
        check_settings(settings.name, settings.type, settings.uri)
    except CatalogSettingsError as exc:
        yield Finding("problem", exc.cause, exc.fix)
        return
    sqlite = sqlite_path(settings.uri) if settings.type == "sql" and settings.uri else None
    if pre.dry_run and sqlite is not None and not sqlite.exists():
        yield Finding("ok", f"catalog {settings.name!r}: {sqlite} does not exist yet; the sink creates it")
        return
    try:
        catalog = load_catalog(settings, create=not pre.dry_run)
        catalog.list_namespaces()
    except Exception as exc:
        log.debug("catalog %r did not answer", settings.name, exc_info=True)
        yield Finding(
            "problem",
            f"catalog {settings.name!r} (catalog.type={settings.type}, catalog.uri) is not reachable: "
            f"{unreachable(exc)}",
            "check catalog.uri and the catalog's credentials in the catalog: section",
        )
        return
    pre.catalog = catalog
    yield Finding("ok", f"catalog {settings.name!r} (catalog.type={settings.type}) answers")


Check = Callable[[Preflight], Iterator[Finding]]
CHECKS: tuple[tuple[str, Check], ...] = (
    ("broker", check_broker),
    ("source topics", check_source_topics),
    ("sink topics", check_sink_topics),
    ("warehouse", check_warehouse),
    ("catalog", check_catalog),
)


def run(config: SinkConfig, broker_timeout_s: float = BROKER_TIMEOUT_S) -> None:
    """Every check in order; the first problem raises :class:`PreflightError`, warnings are logged."""
    pre = Preflight(config, broker_timeout_s)
    for name, check in CHECKS:
        for finding in check(pre):
            if finding.level == "problem":
                raise PreflightError(finding.text, finding.fix)
            if finding.level == "warning":
                log.warning("%s", finding.text)
        log.debug("pre-flight check %s: ok", name)
    log.info("pre-flight checks passed (%s)", ", ".join(name for name, _ in CHECKS))
