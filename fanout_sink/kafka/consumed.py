"""What one ``consume`` call brought, in Arrow: each partition's records as record batches of
:data:`RAW_RECORD_SCHEMA`, and the events (partition EOFs, errors) beside them.

A range reader consumes with one of two functions of this shape (:data:`Consume`):
:func:`python_consume`, confluent-kafka's ``Consumer.consume`` (one Python ``Message`` per record,
then a list per column), or the native one (:mod:`fanout_sink.kafka.native_consume`: the same
consumer, its records copied into Arrow buffers in C). Both give the same :class:`Consumed`, so
everything a reader decides after a consume is written once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
RAW_RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(_HEADER)),
    ]
)
"""A slice of Kafka records in Arrow: the columns (and names) Spark's Kafka source gives with
``includeHeaders=true``, which the sink read through Spark before; ``headers`` is null for a record
without headers, ``timestampType`` 0 = CreateTime, 1 = LogAppendTime."""

OFFSET = RAW_RECORD_SCHEMA.get_field_index("offset")

PartitionKey = tuple[str, int]
"""A partition as the readers key it: (topic, partition)."""


@dataclass
class Consumed:
    """One consume call: ``runs`` are records of one partition each, in the order they came (a
    partition's offsets ascending); ``events`` are partition EOFs (their offset: where the partition
    ends) and errors, keyed by partition (``None``: of no partition)."""

    runs: list[tuple[PartitionKey, pa.RecordBatch]]
    events: list[tuple[PartitionKey | None, int, KafkaError]]


Consume = Callable[[int, float], Consumed]
"""``consume(max_messages, timeout_s)`` of one consumer."""


def python_consume(consumer: Consumer) -> Consume:
    """confluent-kafka's ``consume``: a ``Message`` per record, then one list per column."""

    def consume(max_messages: int, timeout_s: float) -> Consumed:
        messages = consumer.consume(max_messages, timeout=timeout_s)
        # Comprehensions, not a loop with a body per message: this runs for every record.
        errors = [m for m in messages if m.error() is not None]
        records = [m for m in messages if m.error() is None] if errors else messages
        events = [_event(m) for m in errors]
        if not records:
            return Consumed([], events)
        keys = [(m.topic(), m.partition()) for m in records]
        if keys.count(keys[0]) == len(keys):
            return Consumed([(_key(records[0]), _record_batch(*_key(records[0]), records))], events)
        runs = []
        at = 0
        for _, group in itertools.groupby(keys):
            count = sum(1 for _ in group)
            key = _key(records[at])
            runs.append((key, _record_batch(*key, records[at : at + count])))
            at += count
        return Consumed(runs, events)

    return consume


def _key(message: Message) -> PartitionKey:
    return str(message.topic()), int(message.partition() or 0)


def _event(message: Message) -> tuple[PartitionKey | None, int, KafkaError]:
    error = message.error()
    assert error is not None
    return (_key(message) if message.topic() is not None else None), _offset(message), error


def _offset(message: Message) -> int:
    """A consumed message's (or EOF event's) offset; librdkafka sets it on both."""
    offset = message.offset()
    assert offset is not None, "a consumed message carries its offset"
    return offset


def _record_batch(topic: str, partition: int, records: list[Message]) -> pa.RecordBatch:
    """Records of one partition as Arrow: a list per column, vectorised conversions after that."""
    count = len(records)
    stamps = [m.timestamp() for m in records]
    millis = pa.array([ms for _kind, ms in stamps], pa.int64())
    # librdkafka: 0 not available, 1 CreateTime, 2 LogAppendTime; Spark: 0 CreateTime, 1 LogAppendTime.
    kinds = pc.subtract(pa.array([kind for kind, _ms in stamps], pa.int32()), pa.scalar(1, pa.int32()))
    headers = [m.headers() for m in records]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in records], pa.binary()),
            pa.array([m.value() for m in records], pa.binary()),
            pa.array([topic] * count, pa.string()),
            pa.array([partition] * count, pa.int32()),
            pa.array([m.offset() for m in records], pa.int64()),
            pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(pa.timestamp("us", tz="UTC")),
            kinds,
            _headers(headers),
        ],
        schema=RAW_RECORD_SCHEMA,
    )


def _headers(headers: list[Any]) -> pa.Array:
    """Null where a record has no headers (as Spark gave them); a list of key/value structs else."""
    list_type = RAW_RECORD_SCHEMA.field("headers").type
    if not any(headers):
        return pa.nulls(len(headers), list_type)
    offsets, keys, values = [0], [], []
    for pairs in headers:
        for key, value in pairs or ():
            keys.append(key)
            values.append(value)
        offsets.append(len(keys))
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(_HEADER)
    )
    mask = pa.array([pairs is None for pairs in headers], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries, type=list_type, mask=mask)


def within(batch: pa.RecordBatch, start: int, end: int) -> pa.RecordBatch:
    """The rows of one partition's records (offsets ascending) with ``start <= offset < end``."""
    if not batch.num_rows:
        return batch
    offsets = batch.column(OFFSET)
    if offsets[0].as_py() >= start and offsets[-1].as_py() < end:
        return batch
    first = pc.sum(pc.less(offsets, start)).as_py() or 0
    last = pc.sum(pc.less(offsets, end)).as_py() or 0
    return batch.slice(first, max(0, last - first))


def last_offset(batch: pa.RecordBatch) -> int:
    """The offset of a non-empty batch's last record."""
    return int(batch.column(OFFSET)[-1].as_py())
