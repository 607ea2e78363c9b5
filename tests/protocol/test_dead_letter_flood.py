"""Dead-letter floods and oversized dead letters through the worker, on the real broker and catalog.

Real: the broker, the catalog, the worker's transaction and the producer's own limits. Simulated:
the flood is scaled down by setting ``queue.buffering.max.messages`` in the sink's ``kafka:``
properties (the same code path as the default queue of 100,000 messages overflowing: librdkafka
raises ``BufferError`` from ``produce`` once the queue holds that many undelivered messages).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from support.common import end_offset, produce_json
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.protocol import channel
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform import deadletter


def _sink(
    make_topic: Callable[..., str], sink_factory: SinkFactory, kafka: dict[str, str], **source: Any
) -> tuple[SinkUnderTest, str, SliceWorker]:
    """A dead-letter topic, then a sink with table a (``source``: how ``sink_factory`` makes its one
    source topic) and its control topic; the sink, the dead-letter topic and a worker writing to it."""
    dlq = make_topic("dlq")
    sink = sink_factory(tables="a", prefix="s", kafka=kafka, **source)
    channel.ensure_control_topic(sink.channel)
    return sink, dlq, sink.worker(dead_letter_topic=dlq)


def _dead_letters(read_topic: Callable[..., list[Any]], topic: str, count: int) -> list[Any]:
    """The topic's committed messages once ``count`` are visible: the broker writes the commit markers
    after ``commit_transaction`` returns, so a read right after it may stop at the open transaction."""
    deadline = time.monotonic() + 30
    while len(messages := read_topic(topic)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return messages


def test_more_dead_letters_than_the_producer_queue_holds_commit_each_once(
    make_topic: Callable[..., str], sink_factory: SinkFactory, read_topic: Callable[..., list[Any]]
) -> None:
    queue = {"queue.buffering.max.messages": "200"}
    sink, dlq, worker = _sink(make_topic, sink_factory, queue, partitions={"src": 1})
    bad = [f"bad-{i}".encode() for i in range(1000)]
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": 1, "table": "a"}, *bad])

    result = sink.deliver(worker, end_offset(sink.bootstrap, sink.topic, 0))

    assert result.transaction_committed and result.dead_lettered == len(bad)
    assert sorted(m.value() for m in _dead_letters(read_topic, dlq, len(bad))) == sorted(bad)
    worker.close()


def test_a_dead_letter_larger_than_the_message_limit_is_truncated_with_headers(
    make_topic: Callable[..., str], sink_factory: SinkFactory, read_topic: Callable[..., list[Any]]
) -> None:
    big_topic = {"max.message.bytes": str(3 * 1024 * 1024)}
    sink, dlq, worker = _sink(make_topic, sink_factory, {}, partitions={"big": 1}, topic_config=big_topic)
    big = b"not json " + b"x" * (2 * 1024 * 1024)
    producer = Producer({"bootstrap.servers": sink.bootstrap, "message.max.bytes": 3_000_000})
    for value in (big, b"small bad"):
        producer.produce(sink.topic, value=value, partition=0)
    producer.flush(30)

    result = sink.deliver(worker, end_offset(sink.bootstrap, sink.topic, 0))

    assert result.transaction_committed and result.dead_lettered == 2
    truncated, small = _dead_letters(read_topic, dlq, 2)
    assert small.value() == b"small bad" and deadletter.TRUNCATED not in dict(small.headers())
    headers = dict(truncated.headers())
    assert headers[deadletter.TRUNCATED] == b"value"
    assert headers[deadletter.ORIGINAL_VALUE_SIZE] == str(len(big)).encode()
    assert 900_000 < len(truncated.value()) < 1_000_000 and big.startswith(truncated.value())
    assert headers["fanout-sink.reason"].startswith(b"not JSON")
    worker.close()
