"""The local broker is a real Kafka: transactions, read_committed, fencing, memberless-group offsets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient


def _transactional_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(30)
    return producer


def test_transaction_commits_records_with_offsets_of_a_memberless_group(
    bootstrap_servers: str, make_topic: Callable[..., str], read_topic: Callable[..., list[Any]]
) -> None:
    source, sink = make_topic("source"), make_topic("sink")
    group = f"sink-group-{source}"
    # A consumer that never subscribes never joins its group: its metadata carries generation -1,
    # which the broker accepts for a group without members.
    holder = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group})
    metadata = holder.consumer_group_metadata()

    producer = _transactional_producer(bootstrap_servers, f"txn-{sink}")
    producer.begin_transaction()
    for i in range(5):
        producer.produce(sink, value=f"committed-{i}".encode())
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 5)], metadata, 30)
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(sink, value=f"aborted-{i}".encode())
    producer.flush(10)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(sink, value=b"after-abort")
    producer.commit_transaction(30)
    holder.close()

    committed = [m.value() for m in read_topic(sink, "read_committed")]
    assert committed == [f"committed-{i}".encode() for i in range(5)] + [b"after-abort"]
    uncommitted = [m.value() or b"" for m in read_topic(sink, "read_uncommitted")]
    assert sum(v.startswith(b"aborted-") for v in uncommitted) == 3

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(source, 0)])
    result = admin.list_consumer_group_offsets([request], require_stable=True)[group].result(timeout=30)
    assert [(tp.topic, tp.partition, tp.offset) for tp in result.topic_partitions] == [(source, 0, 5)]


def test_second_producer_with_same_transactional_id_fences_the_first(
    bootstrap_servers: str, make_topic: Callable[..., str], read_topic: Callable[..., list[Any]]
) -> None:
    topic = make_topic("fence")
    txn_id = f"txn-{topic}"
    zombie = _transactional_producer(bootstrap_servers, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"from-zombie")
    zombie.flush(10)

    successor = _transactional_producer(bootstrap_servers, txn_id)  # init_transactions fences the zombie
    successor.begin_transaction()
    successor.produce(topic, value=b"from-successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as excinfo:
        zombie.produce(topic, value=b"more-from-zombie")
        zombie.commit_transaction(30)
    error = excinfo.value.args[0]
    assert error.fatal() or error.code() in {KafkaError._FENCED, KafkaError.PRODUCER_FENCED}

    assert [m.value() for m in read_topic(topic)] == [b"from-successor"]
