"""The stream's planner: Spark's Kafka source, configured from the sink's librdkafka properties.

Spark plans the end offsets per micro-batch (triggers, ``maxOffsetsPerTrigger``) and keeps its
checkpoint in its usual format; the micro-batch DataFrame itself is never executed, because the
tasks read their ranges with librdkafka (:mod:`fanout_sink.kafka.range_reader`). The source still
talks to the broker through the Java client to plan, so the ``kafka:`` section is translated (names
the Java client knows, credentials as a JAAS config). ``read_committed`` keeps the planned ends at
the last stable offset, the same isolation the tasks read with.
"""

from __future__ import annotations

import logging
from typing import Any

from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.java_client import spark_kafka_options

log = logging.getLogger("fanout_sink.app")


def java_client_names(spark: Any) -> frozenset[str]:
    """Property names the Java consumer and admin client on Spark's classpath know (Spark's Kafka
    source uses both), asked from the JVM so that they match its kafka-clients version. Each set
    comes back as one joined string: iterated through Py4J it took two round trips a name (~260 in
    all, 0.36 s of the driver's main thread before the query's start on a loaded machine)."""
    jvm = spark._jvm
    clients = jvm.org.apache.kafka.clients
    sets = (clients.consumer.ConsumerConfig.configNames(), clients.admin.AdminClientConfig.configNames())
    return frozenset(
        name for names in sets for name in str(jvm.java.lang.String.join("\n", names)).split("\n")
    )


def read_stream(spark: Any, config: SinkConfig, starting: str, max_offsets_per_trigger: int | None) -> Any:
    """The Kafka source as a streaming DataFrame, for its planned offsets only."""
    source = config.source
    reader = (
        spark.readStream.format("kafka").option("startingOffsets", starting).option("failOnDataLoss", "true")
    )
    kafka = spark_kafka_options(config.kafka, java_client_names(spark))
    if kafka.left_out:
        log.info(
            "kafka properties not given to Spark's Kafka source (unknown to the Java client, or "
            "refused by Spark): %s",
            ", ".join(kafka.left_out),
        )
    reader = reader.options(**kafka.options)
    # After the user's properties, so read_committed always wins: planned ends never pass an open
    # transaction's records, which the tasks could not read yet.
    reader = reader.option("kafka.isolation.level", "read_committed")
    if source.pattern:
        reader = reader.option("subscribePattern", source.pattern)
    else:
        reader = reader.option("subscribe", ",".join(source.topics))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()
