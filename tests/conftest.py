"""Shared fixtures: one real Kafka broker and one Spark session per test run, fresh catalogs per test."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from support.common import create_topic, embedded_catalog_settings, register_spark_catalog

from fanout_sink import logs
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.broker import KafkaBroker, SaslUser
from fanout_sink.devtools.topics import read_to_end

pytest_plugins = [
    "support.sink_factory",
    "support.stores_fixtures",
    "support.cluster_fixtures",
    "support.expiry_fixtures",
    "support.fixture_markers",
    "support.opt_in_markers",
    "support.lanes",
    "support.broker_watch",
]


@pytest.fixture(autouse=True)
def sink_log_as_found() -> Iterator[None]:
    """The sink's logger as it was before each test. A test that runs a command in-process
    (``cli.main``) configures it for the rest of the process: its own handler, no propagation to the
    root logger, where ``caplog`` listens. Without this, a later test of the same pytest process that
    reads ``caplog`` heard nothing, so which lane a test was dealt to decided whether it passed."""
    logger = logging.getLogger(logs.ROOT)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The suite's shared broker. Tests that stop or kill a broker use ``broker_factory`` instead."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The suite's secured broker, shared by the TLS, secrets and pre-flight tests (none stops it):
    PLAINTEXT for the tests' own clients, SASL_PLAINTEXT, SSL with mTLS and SASL_SSL. Its one SASL user
    is ``tls_broker.sasl_user``, its client key is encrypted with ``tls_broker.tls_files
    .client_key_password``; both are random hex that a test may search every output for."""
    sasl_user = SaslUser("sink", secrets.token_hex(16))
    folder = tmp_path_factory.mktemp("kafka-tls")
    broker = KafkaBroker(folder, sasl_user=sasl_user, tls=True, key_password=secrets.token_hex(16))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., KafkaBroker]]:
    """Private brokers for tests that restart or kill them (``tls_broker`` is the shared SASL and TLS
    one); all are stopped at the end of the test."""
    started: list[KafkaBroker] = []

    def make(
        sasl_user: SaslUser | None = None, tls: bool = False, key_password: str | None = None
    ) -> KafkaBroker:
        folder = tmp_path / f"kafka-{len(started)}"
        broker = KafkaBroker(folder, sasl_user=sasl_user, tls=tls, key_password=key_password)
        broker.start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.stop()


@pytest.fixture(scope="session")
def bootstrap_servers(kafka_broker: KafkaBroker) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def make_topic(bootstrap_servers: str) -> Callable[..., str]:
    """Creates a uniquely named topic on the shared broker and returns its name."""

    def create(prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        return create_topic(bootstrap_servers, prefix, partitions, config)

    return create


@pytest.fixture
def read_topic(bootstrap_servers: str) -> Callable[..., list[Message]]:
    """``read_topic(topic, isolation="read_committed")``: every message of the topic on the shared broker."""

    def read(topic: str, isolation: str = "read_committed") -> list[Message]:
        return read_to_end(bootstrap_servers, [topic], isolation)

    return read


@pytest.fixture
def catalog_settings(tmp_path: Path) -> CatalogSettings:
    """A fresh embedded catalog per test (see ``embedded_catalog_settings``)."""
    return embedded_catalog_settings(tmp_path)


@pytest.fixture
def catalog(catalog_settings: CatalogSettings) -> Any:
    return load_catalog(catalog_settings)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local Spark session for the run. Iceberg catalogs are added per test with ``spark_catalog``."""
    from fanout_sink.spark.session import build_spark_session

    session = build_spark_session(master="local[2]", app_name="fanout-sink-tests")
    yield session
    session.stop()


@pytest.fixture
def spark_catalog(spark: Any, catalog_settings: CatalogSettings) -> str:
    """Registers this test's catalog in the shared Spark session and returns its name."""
    return register_spark_catalog(spark, catalog_settings)
