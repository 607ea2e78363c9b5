"""``fanout-sink run`` stops before anything starts or is created when the broker, the credentials,
the topics, the catalog or the warehouse are wrong, with one line naming the cause and one fix line.

Real: the CLI in a child process, the shared broker, the shared SASL and TLS broker
(``tls_broker``), a closed port (nothing listens on it), a catalog section without a URI, and a
warehouse below a file.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from chaos.app_process import child_env
from confluent_kafka.admin import AdminClient

from fanout_sink.catalog import CatalogSettings
from fanout_sink.devtools.stack.broker import KafkaBroker, free_port


def _run(tmp_path: Path, kafka: dict[str, str], **sections: Any) -> tuple[int, list[str]]:
    """Run the CLI on a config; its exit code and stderr lines. A run that passed the pre-flight would
    start Spark and stream forever, so the bound on the run is also what fails such a test."""
    config = tmp_path / "sink.yaml"
    sections.setdefault("source", {"topics": ["orders"]})
    sections.setdefault("tables", {"a.b": {}})
    config.write_text(yaml.safe_dump({"name": f"pre{uuid.uuid4().hex[:6]}", "kafka": kafka, **sections}))
    done = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(config)],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stderr.strip().splitlines()


def _two_lines(code: int, lines: list[str]) -> str:
    """The cause line, after checking the end of the output is exactly cause + fix and nothing raw."""
    text = "\n".join(lines)
    assert code == 2, text[-3000:]
    assert "Traceback" not in text and "%3|" not in text and "%4|" not in text, text[-3000:]
    cause, fix = lines[-2:]
    assert cause.startswith("fanout-sink: ") and fix.startswith("  fix: "), text[-3000:]
    return cause


def _catalog(tmp_path: Path) -> dict[str, str]:
    return CatalogSettings(
        uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}"
    ).model_dump(exclude_none=True)


def test_an_unreachable_broker_fails_in_seconds_with_cause_and_fix(tmp_path: Path) -> None:
    servers = f"127.0.0.1:{free_port()}"
    code, lines = _run(tmp_path, {"bootstrap.servers": servers}, catalog=_catalog(tmp_path))
    cause = _two_lines(code, lines)
    assert "unreachable" in cause and servers in cause and 'kafka."bootstrap.servers"' in cause


def test_a_wrong_sasl_password_is_reported_as_authentication(tmp_path: Path, tls_broker: KafkaBroker) -> None:
    assert tls_broker.sasl_user is not None and tls_broker.sasl_user.password != "wrong-password"
    kafka = {
        "bootstrap.servers": tls_broker.sasl_bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "sink",
        "sasl.password": "wrong-password",
    }
    code, lines = _run(tmp_path, kafka, catalog=_catalog(tmp_path))
    cause = _two_lines(code, lines)
    assert "authentication" in cause.lower() and "sink" in cause and "wrong-password" not in cause
    assert 'kafka."sasl.password"' in lines[-1]


def test_a_missing_source_topic_is_named_and_nothing_is_created(
    tmp_path: Path, bootstrap_servers: str
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    before = set(admin.list_topics(timeout=30).topics)
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    code, lines = _run(
        tmp_path,
        {"bootstrap.servers": bootstrap_servers},
        source={"topics": [missing]},
        catalog=_catalog(tmp_path),
        **{"dead-letter": {"topic": f"dlq-{uuid.uuid4().hex[:6]}"}},
    )
    cause = _two_lines(code, lines)
    assert missing in cause and "source.topics" in cause
    assert set(admin.list_topics(timeout=30).topics) == before


def test_a_catalog_without_uri_names_the_yaml_key(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    code, lines = _run(
        tmp_path, {"bootstrap.servers": bootstrap_servers}, source={"topics": [make_topic("src")]}
    )
    cause = _two_lines(code, lines)
    assert "catalog.uri" in cause


def test_an_unwritable_warehouse_names_the_yaml_key(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    (tmp_path / "a-file").write_text("not a folder")  # the tests run as root: permissions would not stop it
    catalog = {**_catalog(tmp_path), "warehouse": f"file://{tmp_path / 'a-file' / 'warehouse'}"}
    code, lines = _run(
        tmp_path,
        {"bootstrap.servers": bootstrap_servers},
        source={"topics": [make_topic("src")]},
        catalog=catalog,
    )
    cause = _two_lines(code, lines)
    assert "catalog.warehouse" in cause
