"""The ``kafka:`` section (librdkafka names) as options of Spark's Kafka source (Java client names).

The sink's own clients (workers, coordinator, control channel, admin) are confluent-kafka and take
the section as it is. Spark's Kafka source is the Java client, which differs in three ways:

- credentials: librdkafka has ``sasl.username``/``sasl.password``; Java has one ``sasl.jaas.config``
  naming a login module with the user and password inside, quoted;
- names: librdkafka's ``sasl.mechanisms`` is Java's ``sasl.mechanism``, and many librdkafka keys
  (``debug``, ``ssl.ca.location``, ...) do not exist in Java, which logs a warning per unknown key;
- Spark refuses a few consumer keys outright (it manages offsets and deserialisation itself).

So only keys the Java client knows are passed (the caller asks the JVM which, so the list matches the
kafka-clients version on Spark's classpath), and the credentials are translated. Errors name keys,
never values: the values next to them are secrets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

# Login modules for the mechanisms whose JAAS config is just a user and a password.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Spark's Kafka source throws on these (see its "Kafka Specific Configurations" documentation).
SPARK_REFUSES = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "interceptor.classes",
        "key.deserializer",
        "value.deserializer",
    }
)
_CREDENTIALS = ("sasl.username", "sasl.password")
_MECHANISM_ALIAS = "sasl.mechanisms"  # librdkafka's plural spelling of sasl.mechanism


def jaas_quote(value: str) -> str:
    """A JAAS option value in double quotes; Kafka's JAAS parser reads backslash escapes inside them."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sasl_jaas_config(kafka: Mapping[str, str]) -> str | None:
    """Java's ``sasl.jaas.config`` for librdkafka's ``sasl.username``/``sasl.password``; None without them.

    Raises ``ValueError`` when the section cannot serve both clients; ``load_config`` calls this so
    that the problem is reported before anything starts.
    """
    if "sasl.jaas.config" in kafka:
        raise ValueError(
            "sasl.jaas.config is a Java client property that librdkafka rejects; give sasl.username and "
            "sasl.password instead (the sink builds the JAAS config for Spark's Kafka source)"
        )
    given = [key for key in _CREDENTIALS if key in kafka]
    if not given:
        return None
    if len(given) == 1:
        missing = next(key for key in _CREDENTIALS if key not in kafka)
        raise ValueError(f"{given[0]} is set but {missing} is not; give both, e.g. {missing}: ${{ENV_VAR}}")
    mechanism = kafka.get("sasl.mechanism", kafka.get(_MECHANISM_ALIAS))
    if mechanism not in LOGIN_MODULES:
        raise ValueError(
            f"sasl.username/sasl.password need sasl.mechanism {', '.join(LOGIN_MODULES)} "
            f"(got {mechanism!r}); e.g. sasl.mechanism: PLAIN"
        )
    user, password = (jaas_quote(kafka[key]) for key in _CREDENTIALS)
    return f"{LOGIN_MODULES[mechanism]} required username={user} password={password};"


@dataclass(frozen=True)
class SparkKafkaOptions:
    """Options for ``spark.readStream.format("kafka")``, and the keys left out of them."""

    options: dict[str, str]
    left_out: tuple[str, ...]


def spark_kafka_options(kafka: Mapping[str, str], java_names: Collection[str]) -> SparkKafkaOptions:
    """``kafka.<name>`` options for the librdkafka properties in ``kafka``.

    ``java_names`` are the property names the Java consumer and admin client know; keys outside them
    (librdkafka-only) and keys Spark refuses are left out, the credentials become ``sasl.jaas.config``.
    """
    options: dict[str, str] = {}
    left_out: list[str] = []
    for key, value in kafka.items():
        name = "sasl.mechanism" if key == _MECHANISM_ALIAS else key
        if name in java_names and name not in SPARK_REFUSES:
            options[f"kafka.{name}"] = value
        elif key not in _CREDENTIALS:
            left_out.append(key)
    jaas = sasl_jaas_config(kafka)
    if jaas is not None:
        options["kafka.sasl.jaas.config"] = jaas
    return SparkKafkaOptions(options, tuple(sorted(left_out)))
