"""Dead-letter floods and oversized dead letters through the worker, on the real broker and catalog.

Real: the broker, the catalog, the worker's transaction and the producer's own limits. Simulated:
the flood is scaled down by setting ``queue.buffering.max.messages`` in the sink's ``kafka:``
properties (the same code path as the default queue of 100,000 messages overflowing: librdkafka
raises ``BufferError`` from ``produce`` once the queue holds that many undelivered messages).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from support.common import create_tables, end_offset, make_processor, produce_json, read_slice

from fanout_sink.protocol import channel
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform import deadletter


def _worker(
    bootstrap: str, make_topic: Callable[..., str], catalog: Any, kafka: dict[str, str]
) -> tuple[str, SliceWorker]:
    sink = f"s{uuid.uuid4().hex[:6]}"
    control, dlq = f"{sink}-control", make_topic("dlq")
    conf = {"bootstrap.servers": bootstrap, **kafka}
    channel.ensure_control_topic(channel.SinkChannel(sink, conf, control))
    create_tables(catalog, ["a"])
    return dlq, SliceWorker(SinkChannel(sink, conf, control), dead_letter_topic=dlq)


def _dead_letters(read_topic: Callable[..., list[Any]], topic: str, count: int) -> list[Any]:
    """The topic's committed messages once ``count`` are visible: the broker writes the commit markers
    after ``commit_transaction`` returns, so a read right after it may stop at the open transaction."""
    deadline = time.monotonic() + 30
    while len(messages := read_topic(topic)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return messages


def test_more_dead_letters_than_the_producer_queue_holds_commit_each_once(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    read_topic: Callable[..., list[Any]],
) -> None:
    dlq, worker = _worker(bootstrap_servers, make_topic, catalog, {"queue.buffering.max.messages": "200"})
    source = make_topic("src")
    bad = [f"bad-{i}".encode() for i in range(1000)]
    produce_json(bootstrap_servers, source, 0, [{"id": 1, "table": "a"}, *bad])
    end = end_offset(bootstrap_servers, source, 0)

    result = worker.commit_slice(
        source, 0, 0, end, read_slice(bootstrap_servers, source, 0, 0, end), make_processor(catalog)
    )

    assert result.transaction_committed and result.dead_lettered == len(bad)
    assert sorted(m.value() for m in _dead_letters(read_topic, dlq, len(bad))) == sorted(bad)
    worker.close()


def test_a_dead_letter_larger_than_the_message_limit_is_truncated_with_headers(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    read_topic: Callable[..., list[Any]],
) -> None:
    dlq, worker = _worker(bootstrap_servers, make_topic, catalog, {})
    source = make_topic("big", config={"max.message.bytes": str(3 * 1024 * 1024)})
    big = b"not json " + b"x" * (2 * 1024 * 1024)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "message.max.bytes": 3_000_000})
    for value in (big, b"small bad"):
        producer.produce(source, value=value, partition=0)
    producer.flush(30)
    end = end_offset(bootstrap_servers, source, 0)

    result = worker.commit_slice(
        source, 0, 0, end, read_slice(bootstrap_servers, source, 0, 0, end), make_processor(catalog)
    )

    assert result.transaction_committed and result.dead_lettered == 2
    truncated, small = _dead_letters(read_topic, dlq, 2)
    assert small.value() == b"small bad" and deadletter.TRUNCATED not in dict(small.headers())
    headers = dict(truncated.headers())
    assert headers[deadletter.TRUNCATED] == b"value"
    assert headers[deadletter.ORIGINAL_VALUE_SIZE] == str(len(big)).encode()
    assert 900_000 < len(truncated.value()) < 1_000_000 and big.startswith(truncated.value())
    assert headers["fanout-sink.reason"].startswith(b"not JSON")
    worker.close()
