"""Reading whole topics back, for the demo, the chaos verdict and the tests.

The sink's own reader (the coordinator's control reader) follows one partition forever; checking
what landed needs the opposite: every message of some topics up to where they end now, then stop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from confluent_kafka import KafkaError, Message, TopicPartition

from fanout_sink.kafka.clients import KafkaClientFactory


def read_to_end(
    bootstrap: str, topics: Sequence[str], isolation: str = "read_committed", timeout_s: float = 60.0
) -> list[Message]:
    """Every message of ``topics`` that ``isolation`` lets through, from offset 0 up to each
    partition's end as it is when called (under ``read_committed``: up to an open transaction).

    Raises :class:`TimeoutError` when a partition stops short of its end for ``timeout_s``.
    """
    consumer = KafkaClientFactory({"bootstrap.servers": bootstrap}).consumer(
        {
            "group.id": f"fanout-sink-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=30).topics
        assignment = [TopicPartition(t, p, 0) for t in topics for p in sorted(metadata[t].partitions)]
        ends = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1]
            for tp in assignment
        }
        pending = {key for key, end in ends.items() if end > 0}
        consumer.assign(assignment)
        messages: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            batch = consumer.consume(10000, timeout=1.0)
            if not batch and time.monotonic() > deadline:
                raise TimeoutError(f"reading {sorted(pending)} stalled before their end offsets")
            for message in batch:
                deadline = time.monotonic() + timeout_s
                error = message.error()
                key = (message.topic() or "", message.partition() or 0)
                if error is not None:
                    # Under read_committed the end is the last stable offset: an open transaction's
                    # messages lie beyond it.
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(key)
                    continue
                messages.append(message)
                if (message.offset() or 0) + 1 >= ends[key]:
                    pending.discard(key)
        return messages
    finally:
        consumer.close()


def header_pairs(message: Message) -> list[tuple[str, bytes]]:
    """A message's headers in order, values as bytes (a header without a value as ``b""``)."""
    raw = message.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return [(str(k), v.encode() if isinstance(v, str) else bytes(v or b"")) for k, v in pairs]
