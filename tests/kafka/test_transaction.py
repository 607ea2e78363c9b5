"""``TransactionalProducer.transaction()`` when its body fails or the producer queue stays full.

Real: the shared test broker and librdkafka's queue limit (``queue.buffering.max.messages``, made
small: the same code path as the default 100,000). Simulated: a broker that never takes the messages
is a topic that does not exist (auto-create is off), so the queue stays full; the transaction's
deadline is shortened with ``transaction.timeout.ms``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from fanout_sink.errors import ProducerFencedError, TransactionStuckError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.transaction import TransactionalProducer


def _producer(bootstrap: str, **conf: str) -> TransactionalProducer:
    kafka = {"bootstrap.servers": bootstrap, "queue.buffering.max.messages": "10", **conf}
    return TransactionalProducer(
        KafkaClientFactory(kafka, timeout_s=15), f"txn-{uuid.uuid4().hex[:8]}", "fenced"
    )


def test_a_non_kafka_error_in_the_body_aborts_and_the_producer_stays_usable(
    bootstrap_servers: str, make_topic: Callable[..., str], read_topic: Callable[..., list[Any]]
) -> None:
    """What happens today (kept): the abort purges what the body queued; the next transaction works."""
    topic = make_topic("txn")
    producer = _producer(bootstrap_servers)
    with pytest.raises(ValueError, match="body failed"), producer.transaction():
        producer.produce(topic, b"aborted")
        raise ValueError("body failed")
    assert producer.usable
    with producer.transaction():
        producer.produce(topic, b"committed")
    assert [m.value() for m in read_topic(topic)] == [b"committed"]


def test_more_messages_than_the_queue_holds_wait_for_room(
    bootstrap_servers: str, make_topic: Callable[..., str], read_topic: Callable[..., list[Any]]
) -> None:
    topic = make_topic("txn")
    producer = _producer(bootstrap_servers)
    values = [f"m{i}".encode() for i in range(100)]
    with producer.transaction():
        for value in values:
            producer.produce(topic, value)
    assert [m.value() for m in read_topic(topic)] == values


def test_a_queue_that_stays_full_gives_the_producer_up_at_the_transaction_deadline(
    bootstrap_servers: str,
) -> None:
    producer = _producer(bootstrap_servers, **{"transaction.timeout.ms": "3000"})
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TransactionStuckError, match="stayed full"), producer.transaction():
        for _ in range(11):
            producer.produce(missing, b"never delivered")
    assert not producer.usable


def test_a_producer_fenced_mid_transaction_says_fenced_even_with_a_plain_fatal_error(
    bootstrap_servers: str, make_topic: Callable[..., str], read_topic: Callable[..., list[Any]]
) -> None:
    """Spark's two Python workers each cache a producer for one partition's transactional id, so the
    newer fences the older between two slices; the older learns it inside its next transaction. Only
    the first call that meets the fence gets librdkafka's real error (``_FENCED``, fatal flag set);
    every later one a plain ``_FATAL`` whose fatal flag is unset (a latency run on the app saw it at
    the slice's ``DataComplete``, and the batch failed instead of the cached producer being
    replaced). Both are fencing. Which call meets the real error is timing: librdkafka's own thread
    can raise the fatal error first, and then even the first produce call gets the plain one."""
    topic = make_topic("txn")
    factory = KafkaClientFactory(
        {"bootstrap.servers": bootstrap_servers, "queue.buffering.max.messages": "10"}, timeout_s=15
    )
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    older = TransactionalProducer(factory, txn_id, "fenced")
    with older.transaction():
        older.produce(topic, b"first")
    newer = TransactionalProducer(factory, txn_id, "fenced")  # init_transactions fences the older
    with pytest.raises(ProducerFencedError), older.transaction():
        with pytest.raises(KafkaException) as met:
            for n in range(1000):  # the full queue's waits serve the broker's answer
                older.produce(topic, f"zombie-{n}".encode())
        assert met.value.args[0].code() in (KafkaError._FENCED, KafkaError._FATAL), met.value
        older.produce(topic, b"after the fence")  # the plain _FATAL, whichever came first
    assert not older.usable
    with newer.transaction():
        newer.produce(topic, b"second")
    assert [m.value() for m in read_topic(topic)] == [b"first", b"second"]
