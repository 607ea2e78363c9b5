"""``fanout-sink run`` stops before anything starts or is created when the broker, the credentials,
the topics, the catalog or the warehouse are wrong, with one line naming the cause and one fix line.

Real: the CLI in a child process, on a sink from the sink factory with one section made wrong: the
shared broker, the shared SASL and TLS broker (``tls_broker``), a closed port (nothing listens on
it), a catalog section without a URI, and a warehouse below a file.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.catalog import CatalogSettings
from fanout_sink.devtools.stack.broker import KafkaBroker, free_port


def _run(sink: SinkUnderTest) -> tuple[int, list[str]]:
    """Run the CLI on the sink's config; its exit code and stderr lines. A run that passed the
    pre-flight would start Spark and stream forever, so the bound on the run is also what fails such
    a test."""
    done = sink.attempt(timeout=120)
    return done.returncode, done.stderr.strip().splitlines()


def _two_lines(code: int, lines: list[str]) -> str:
    """The cause line, after checking the end of the output is exactly cause + fix and nothing raw."""
    text = "\n".join(lines)
    assert code == 2, text[-3000:]
    assert "Traceback" not in text and "%3|" not in text and "%4|" not in text, text[-3000:]
    cause, fix = lines[-2:]
    assert cause.startswith("fanout-sink: ") and fix.startswith("  fix: "), text[-3000:]
    return cause


def test_an_unreachable_broker_fails_in_seconds_with_cause_and_fix(sink_factory: SinkFactory) -> None:
    servers = f"127.0.0.1:{free_port()}"
    code, lines = _run(sink_factory(overrides={"kafka": {"bootstrap.servers": servers}}))
    cause = _two_lines(code, lines)
    assert "unreachable" in cause and servers in cause and 'kafka."bootstrap.servers"' in cause


def test_a_wrong_sasl_password_is_reported_as_authentication(
    sink_factory: SinkFactory, tls_broker: KafkaBroker
) -> None:
    assert tls_broker.sasl_user is not None and tls_broker.sasl_user.password != "wrong-password"
    kafka = {
        "bootstrap.servers": tls_broker.sasl_bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "sink",
        "sasl.password": "wrong-password",
    }
    code, lines = _run(sink_factory(bootstrap=tls_broker.bootstrap_servers, overrides={"kafka": kafka}))
    cause = _two_lines(code, lines)
    assert "authentication" in cause.lower() and "sink" in cause and "wrong-password" not in cause
    assert 'kafka."sasl.password"' in lines[-1]


def test_a_missing_source_topic_is_named_and_nothing_is_created(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    sink = sink_factory(
        topics={},
        source={"topics": [missing]},
        overrides={"dead-letter": {"topic": f"dlq-{uuid.uuid4().hex[:6]}"}},
    )
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    before = set(admin.list_topics(timeout=30).topics)
    code, lines = _run(sink)
    cause = _two_lines(code, lines)
    assert missing in cause and "source.topics" in cause
    assert set(admin.list_topics(timeout=30).topics) == before


def test_a_catalog_without_uri_names_the_yaml_key(sink_factory: SinkFactory) -> None:
    code, lines = _run(sink_factory(overrides={"catalog": {}}))
    cause = _two_lines(code, lines)
    assert "catalog.uri" in cause


def test_an_unwritable_warehouse_names_the_yaml_key(sink_factory: SinkFactory, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")  # the tests run as root: permissions would not stop it
    catalog = CatalogSettings(
        uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'a-file' / 'warehouse'}"
    )
    code, lines = _run(sink_factory(overrides={"catalog": catalog.model_dump(exclude_none=True)}))
    cause = _two_lines(code, lines)
    assert "catalog.warehouse" in cause
