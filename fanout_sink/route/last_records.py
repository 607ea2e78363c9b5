"""``fanout-sink route --topic T --last N``: the last N offsets of each partition of a topic.

Read with the workers' own :class:`~fanout_sink.kafka.range_reader.RangeReader` (``read_committed``,
assigned, never subscribed, never committing), from ``max(log start, last stable offset - N)`` to
the last stable offset, so what is previewed is what a batch ending now would read. Nothing is
committed: no group gets a member or an offset. Transaction markers and aborted records count among
the N offsets, so a partition can give fewer than N records.
"""

from __future__ import annotations

import pyarrow as pa

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import log_start_offset, source_positions
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol.channel import sink_group


def read_last(config: SinkConfig, topic: str, last: int) -> list[pa.Table]:
    """One raw slice per partition of ``topic`` holding its last ``last`` offsets' records."""
    clients = KafkaClientFactory(config.kafka)
    group = sink_group(config.name)
    try:
        positions = source_positions(clients, group, [topic])
    except Exception as exc:  # the broker's own errors: unreachable, not authorised
        raise FanoutSinkError(
            f"--topic {topic}: the broker did not answer ({exc}); check kafka.bootstrap.servers"
        ) from None
    if not positions:
        raise FanoutSinkError(
            f"--topic {topic}: no such topic on the broker; check the name (kafka-topics --list)"
        )
    reader = RangeReader(clients, group)
    try:
        slices = []
        for position in positions:
            end = position.end
            start = max(log_start_offset(clients, topic, position.partition), end - last)
            if end > start:
                slices.append(reader.read(topic, position.partition, start, end))
        return slices
    finally:
        reader.close()
