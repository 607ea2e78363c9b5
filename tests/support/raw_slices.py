"""Raw slices (``RAW_RECORD_SCHEMA`` tables) built from Python values or consumed messages, for the
benchmarks and the tests: what Spark's Kafka source hands a task, without Spark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from fanout_sink.transform.records import RAW_RECORD_SCHEMA

_EPOCH = datetime(2024, 5, 1, tzinfo=UTC)


def make_raw_slice(
    values: Sequence[bytes | None],
    *,
    topic: str = "events",
    partition: int = 0,
    start_offset: int = 0,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
) -> pa.Table:
    """One topic-partition's slice with ascending offsets from ``start_offset``."""
    n = len(values)
    return pa.table(
        {
            "key": list(keys) if keys is not None else [None] * n,
            "value": list(values),
            "topic": [topic] * n,
            "partition": [partition] * n,
            "offset": list(range(start_offset, start_offset + n)),
            "timestamp": [_EPOCH + timedelta(milliseconds=i) for i in range(n)],
            "timestampType": [0] * n,
            "headers": [
                None if h is None else [{"key": k, "value": v} for k, v in h]
                for h in (headers if headers is not None else [[]] * n)
            ],
        },
        schema=RAW_RECORD_SCHEMA,
    )


def from_messages(messages: Iterable[Any]) -> pa.Table:
    """A raw slice from confluent-kafka ``Message`` objects (as a plain consumer returns them)."""
    rows: dict[str, list[Any]] = {name: [] for name in RAW_RECORD_SCHEMA.names}
    for message in messages:
        kind, millis = message.timestamp()
        rows["key"].append(message.key())
        rows["value"].append(message.value())
        rows["topic"].append(message.topic())
        rows["partition"].append(message.partition())
        rows["offset"].append(message.offset())
        rows["timestamp"].append(datetime.fromtimestamp(millis / 1000, tz=UTC))
        rows["timestampType"].append(kind)
        headers = message.headers() or []
        rows["headers"].append([{"key": k, "value": v} for k, v in headers])
    return pa.table(rows, schema=RAW_RECORD_SCHEMA)
