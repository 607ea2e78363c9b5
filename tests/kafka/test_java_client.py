"""librdkafka properties -> Spark Kafka source options: credentials, names, keys left out."""

from __future__ import annotations

import pytest

from fanout_sink.kafka.java_client import sasl_jaas_config, spark_kafka_options

JAVA_NAMES = {"bootstrap.servers", "security.protocol", "sasl.mechanism", "enable.auto.commit", "client.id"}


def test_plain_credentials_become_a_quoted_jaas_config() -> None:
    kafka = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",  # librdkafka's plural spelling
        "sasl.username": "sink",
        "sasl.password": 'p"w\\d',
        "debug": "all",  # librdkafka only
        "enable.auto.commit": "false",  # known to Java, refused by Spark's source
    }
    result = spark_kafka_options(kafka, JAVA_NAMES)
    assert result.options == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="sink" password="p\\"w\\\\d";',
    }
    assert result.left_out == ("debug", "enable.auto.commit")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_uses_the_scram_login_module(mechanism: str) -> None:
    jaas = sasl_jaas_config({"sasl.mechanism": mechanism, "sasl.username": "u", "sasl.password": "p"})
    assert (
        jaas == 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
    )


def test_without_credentials_nothing_is_added() -> None:
    result = spark_kafka_options({"bootstrap.servers": "b:9092"}, JAVA_NAMES)
    assert result.options == {"kafka.bootstrap.servers": "b:9092"} and result.left_out == ()


@pytest.mark.parametrize(
    ("kafka", "named"),
    [
        ({"sasl.username": "u", "sasl.password": "SECRET"}, "sasl.mechanism"),
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "SECRET"}, "sasl.mechanism"),
        ({"sasl.mechanism": "PLAIN", "sasl.password": "SECRET"}, "sasl.username"),
        ({"sasl.jaas.config": 'x required password="SECRET";'}, "sasl.username"),
    ],
)
def test_untranslatable_credentials_are_refused_naming_keys_not_values(
    kafka: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as raised:
        sasl_jaas_config(kafka)
    assert "SECRET" not in str(raised.value)
