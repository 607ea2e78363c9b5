"""Secrets from the config never reach an output: the app runs through SASL over TLS with marker
secrets, then every output it made is searched for them.

The run is also the suite's app run over SASL_SSL (SCRAM-SHA-256, with a client certificate): its
exact rows and final round stand for ``tests/e2e/test_kafka_tls.py``'s SASL_SSL case.

The SASL password and the client key's password are the broker's real ones (rows landing prove they
were used); the client key itself, which the sink decrypts for Spark's Java client, is searched for
by a line of its decrypted form; the catalog's object-store keys and the registry credentials are
markers the local warehouse ignores.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Message, Producer
from cryptography.hazmat.primitives import serialization
from support.common import create_topic
from support.sink_factory import SinkFactory

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.cli import main
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.devtools.topics import read_to_end

GOOD, BAD = 40, 3


def _marker(kind: str) -> str:
    return f"MARKER-{kind}-{uuid.uuid4().hex}"


def _found(data: bytes | str, markers: Iterable[str]) -> list[str]:
    """The markers in ``data`` (also with their ``MARKER-`` prefix cut, in case of partial echoes)."""
    blob = data.encode() if isinstance(data, str) else data
    return [m for m in markers if m.encode() in blob or m.split("-")[-1].encode() in blob]


def _log4j_info(folder: Path) -> Path:
    """A log4j2 config under which the app's ``FANOUT_SINK_SPARK_LOG_LEVEL=INFO`` takes effect: Spark's
    ``setLogLevel`` changes nothing (and keeps PySpark's WARN console filter) when the root level is
    INFO already, as it is in Spark's default config. Then Spark logs at INFO, with the Java Kafka
    client's config dumps."""
    path = folder / "log4j2-info.properties"
    path.write_text(
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d %p %c: %m%n%ex\n"
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.console.ref = console\n"
    )
    return path


def _messages(broker: KafkaBroker, topic: str, at_least: int) -> list[Message]:
    messages = read_to_end(broker.bootstrap_servers, [topic])
    assert len(messages) >= at_least, f"{topic}: {len(messages)} messages, expected at least {at_least}"
    return messages


def _message_bytes(message: Message) -> bytes:
    headers = b"".join(k.encode() + (v or b"") for k, v in message.headers() or [])
    return (message.key() or b"") + (message.value() or b"") + headers


@pytest.mark.usefixtures("own_spark")
def test_marker_secrets_reach_no_output_of_a_sasl_run(
    tls_broker: KafkaBroker,
    sink_factory: SinkFactory,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = tls_broker
    assert broker.sasl_user is not None
    password = broker.sasl_user.password  # random hex: searched for whole, like the markers
    catalog_secrets = {
        "s3.access-key-id": _marker("s3id"),
        "s3.secret-access-key": _marker("s3secret"),
        "adls.account-key": _marker("adls"),
    }
    registry_auth = f"registry:{_marker('registry')}"
    key_password = broker.tls_files.client_key_password
    markers = [password, key_password, *catalog_secrets.values(), registry_auth.partition(":")[2]]
    tls = broker.tls_files
    key = serialization.load_pem_private_key(tls.client_key.read_bytes(), key_password.encode())
    decrypted = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).splitlines()
    markers.append(decrypted[len(decrypted) // 2].decode())  # base64: no "-" to split the marker at
    app_dir = tmp_path / "app"  # everything the app writes; the broker's own files live beside it
    (app_dir / "events").mkdir(parents=True)
    kafka = {
        "bootstrap.servers": broker.sasl_ssl_bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": broker.sasl_user.username,
        "sasl.password": "${KAFKA_PASSWORD}",
        **tls.client_properties(),
        "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
    }
    # A catalog and a registry carrying secrets that a local warehouse never uses.
    settings = CatalogSettings.model_validate(
        {
            "name": f"lake_{uuid.uuid4().hex[:8]}",
            "uri": f"sqlite:///{app_dir / 'catalog.db'}",
            "warehouse": f"file://{app_dir / 'warehouse'}",
            **catalog_secrets,
        }
    )
    dlq = create_topic(broker.bootstrap_servers, "dlq")  # the PLAINTEXT listener, as the sink's topics
    sink = sink_factory(
        bootstrap=broker.bootstrap_servers,
        folder=app_dir,
        settings=settings,
        partitions={"source": 2},
        source={"schema-registry": {"url": "http://127.0.0.1:9", "basic.auth.user.info": registry_auth}},
        overrides={
            "kafka": kafka,
            "tables": {"shop.orders": {"when": "type == 'order'"}},
            "dynamic": None,
            "dead-letter": {"topic": dlq},
        },
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(GOOD):
        producer.produce(sink.topic, json.dumps({"type": "order", "id": f"o-{i}"}).encode(), partition=i % 2)
    for i in range(BAD):
        producer.produce(sink.topic, b"{not json", partition=i % 2)
    producer.flush(30)

    options = [
        "--available-now",
        "--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
        "--conf", f"spark.eventLog.dir=file://{app_dir / 'events'}",
        "--conf", f"spark.local.dir={app_dir / 'spark-local'}",
        "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={_log4j_info(tmp_path)}",
    ]  # fmt: skip
    env = {
        "KAFKA_PASSWORD": password,
        "KAFKA_KEY_PASSWORD": key_password,
        "FANOUT_SINK_SPARK_LOG_LEVEL": "INFO",
    }
    run = sink.attempt(*options, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "final commit round" in run.stderr
    assert "sasl.jaas.config = [hidden]" in run.stderr, "Spark logged at INFO, the Kafka client's config too"
    assert "ssl.keystore.key = [hidden]" in run.stderr, "the Java client got the client key"

    leaks: dict[str, list[str]] = {}
    for label, text in (("app stdout", run.stdout), ("app stderr", run.stderr)):
        leaks[label] = _found(text, markers)

    # The rows landed: the app really authenticated with the password.
    monkeypatch.setenv("KAFKA_PASSWORD", password)
    monkeypatch.setenv("KAFKA_KEY_PASSWORD", key_password)
    table = load_catalog(settings).load_table("shop.orders")
    ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert sorted(ids) == sorted(f"o-{i}" for i in range(GOOD)), "every good record once, none twice"
    for snapshot in table.snapshots():
        leaks[f"snapshot {snapshot.snapshot_id} summary"] = _found(
            json.dumps(snapshot.summary.model_dump()), markers
        )
    leaks["table properties"] = _found(json.dumps(table.properties), markers)

    control = _messages(broker, sink.control_topic, at_least=3)
    dead_letters = _messages(broker, dlq, at_least=BAD)
    assert len(dead_letters) == BAD
    for label, messages in (("control topic", control), ("dead-letter topic", dead_letters)):
        leaks[label] = [m for message in messages for m in _found(_message_bytes(message), markers)]

    capfd.readouterr()
    config = str(sink.config_file)
    for args in (["status", "--config", config], ["status", "--config", config, "--json"]):
        assert main(args) == 0
        out, err = capfd.readouterr()
        assert "shop.orders: commit" in out or '"shop.orders"' in out, out
        assert "lag 0" in out or '"lag": 0' in out, "status read the sink group through SASL_SSL"
        leaks[" ".join(args[::2])] = _found(out + err, markers)

    # A run that fails inside a batch: Spark's error, with its query description and plan, names no secret.
    producer.produce(sink.topic, json.dumps({"type": "order", "id": "o-late"}).encode(), partition=0)
    producer.flush(30)
    failed = sink.attempt(
        *options,
        "--conf", "spark.task.maxFailures=1",
        env={**env, "FANOUT_SINK_FAULTS": "worker.after-write-files=raise"},
        timeout=300,
    )  # fmt: skip
    assert failed.returncode != 0 and "InjectedFault" in failed.stderr, failed.stderr[-3000:]
    leaks["failing run's output"] = _found(failed.stdout + failed.stderr, markers)

    files = [path for path in app_dir.rglob("*") if path.is_file() and path != sink.config_file]
    assert any(path.name.startswith("events_") for path in files), "Spark wrote an event log"
    assert any("checkpoints" in path.parts for path in files) and any(path.suffix == ".db" for path in files)
    for path in files:
        leaks[str(path.relative_to(app_dir))] = _found(path.read_bytes(), markers)

    assert {where: found for where, found in leaks.items() if found} == {}


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"kafka": {"sasl.username": "u", "sasl.password": "{m}", "sasl.mechanism": "GSSAPI"}},
         "sasl.mechanism"),
        ({"kafka": {"sasl.password": "{m}"}}, "sasl.username"),
        ({"kafka": {"sasl.jaas.config": 'PlainLoginModule required password="{m}";'}}, "sasl.jaas.config"),
        ({"kafka": "sasl.password={m}"}, "kafka"),
        ({"catalog": {"name": "not a name", "s3.secret-access-key": "{m}"}}, "catalog.name"),
        ({"source": {"topics": ["t"], "format": "xml", "schema-registry": {"basic.auth.user.info": "u:{m}"}}},
         "source.format"),
    ],
)  # fmt: skip
def test_a_bad_config_is_reported_without_the_secret_next_to_it(
    section: dict[str, Any], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = _marker("bad-config")
    data = {"name": "s", "source": {"topics": ["t"]}, "tables": {"a.b": {}}, **section}
    config = tmp_path / "sink.yaml"
    config.write_text(yaml.safe_dump(data).replace("{m}", marker))
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert _found(err, [marker]) == []
