"""The app over Kafka TLS, configured with librdkafka's property names only, for both Kafka clients.

A real broker with a private CA (the suite's shared ``tls_broker``) offers an SSL listener that
requires a client certificate (mTLS) and a SASL_SSL listener (SCRAM-SHA-256). The client key is
encrypted the way OpenSSL 3 does by default (PKCS#8, PBES2), which Java's PEM reader cannot read by
itself. The sink's ``kafka:`` section names only the TLS listener, so every client must speak TLS
for the run to land its rows: Spark's Java Kafka source planning the offsets, and librdkafka in the
workers, the coordinator, the range reader, the transactions and the pre-flight checks.

The app's run over SASL_SSL is ``tests/e2e/test_secrets.py``'s: the same exact rows and final round,
with every output searched for the secrets (an app run of its own here cost another Spark start).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sink_factory import SinkFactory

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.devtools.stack.certificates import make_tls_files


def _mutual_tls(broker: KafkaBroker) -> tuple[dict[str, str], dict[str, str]]:
    """The sink's ``kafka:`` section for the SSL listener (the key's password as ``${VAR}``), and
    that variable."""
    files = broker.tls_files
    kafka = {
        "security.protocol": "SSL",
        "bootstrap.servers": broker.ssl_bootstrap_servers,
        **files.client_properties(),
        "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
    }
    return kafka, {"KAFKA_KEY_PASSWORD": files.client_key_password}


@pytest.mark.usefixtures("own_spark")
def test_the_app_lands_exact_rows_over_mutual_tls_with_both_kafka_clients(
    tls_broker: KafkaBroker, sink_factory: SinkFactory
) -> None:
    kafka, env = _mutual_tls(tls_broker)
    sink = sink_factory(bootstrap=tls_broker.bootstrap_servers, overrides={"kafka": kafka})
    sink.produce(300)  # over PLAINTEXT: the test's producer, not the sink
    log = sink.run("--available-now", env=env)
    assert "final commit round" in log
    sink.assert_exact()
    # The key the Java client got was decrypted in memory: neither it nor a password is in the log.
    key_body = tls_broker.tls_files.client_key.read_text().splitlines()[1]
    for secret in (*env.values(), key_body):
        assert secret not in log


@pytest.mark.parametrize(
    ("mistake", "says", "names"),
    [
        ("a CA that did not sign the broker's certificate", "certificate verify failed", "ssl.ca.location"),
        ("a client certificate of another CA", "bad certificate", "ssl.certificate.location"),
    ],
)
def test_a_tls_mistake_fails_before_start_naming_the_broker_and_the_key(
    tls_broker: KafkaBroker,
    sink_factory: SinkFactory,
    tmp_path: Path,
    mistake: str,
    says: str,
    names: str,
) -> None:
    kafka, env = _mutual_tls(tls_broker)
    other = make_tls_files(tmp_path / "other-ca", ca_name="another CA")
    if names == "ssl.ca.location":
        kafka["ssl.ca.location"] = str(other.ca)
    else:
        kafka.update({**other.client_properties(), "ssl.ca.location": kafka["ssl.ca.location"]})
    sink = sink_factory(bootstrap=tls_broker.bootstrap_servers, overrides={"kafka": kafka})
    done = sink.attempt(env=env, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"{mistake}: {done.stderr[-3000:]}"
    cause, fix = lines[-2:]
    assert tls_broker.ssl_bootstrap_servers in cause and "TLS handshake" in cause and says in cause, cause
    assert f'kafka."{names}"' in fix and fix.startswith("  fix: "), fix
    assert "Traceback" not in done.stderr and "%3|" not in done.stderr
