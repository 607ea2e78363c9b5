"""Spark's Kafka source (the fetched connector jars) reads a topic written by the test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer


def test_spark_kafka_source_reads_committed_records(
    spark: Any, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("spark-src", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"txn-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=str(i).encode(), value=f'{{"id": {i}}}'.encode(), partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b'{"id": -1}', partition=0)
    producer.flush(10)
    producer.abort_transaction(30)

    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = frame.selectExpr("CAST(value AS STRING) AS v", "partition").collect()
    assert sorted(row.v for row in rows) == sorted(f'{{"id": {i}}}' for i in range(50))
    assert {row.partition for row in rows} == {0, 1}
