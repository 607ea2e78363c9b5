"""Dead letters: the original key, value and headers of a record, plus headers saying why.

Header keys (values are UTF-8 text):

=============================  ===============================================================
``fanout-sink.reason``          what went wrong and, where it helps, what to do
``fanout-sink.stage``           ``decode``, ``route``, ``convert`` or ``tombstone``
``fanout-sink.sink``            the sink's ``name``
``fanout-sink.source.topic``    source topic
``fanout-sink.source.partition`` source partition
``fanout-sink.source.offset``   source offset
``fanout-sink.source.timestamp`` source timestamp, epoch milliseconds
``fanout-sink.table``           destination table (convert stage; routing of a dynamic name)
``fanout-sink.column``          the column that failed (convert stage)
=============================  ===============================================================

The worker produces these inside its Kafka transaction, so a dead letter is published exactly
when the slice's offsets are committed.
"""

from __future__ import annotations

from typing import Any

from fanout_sink.transform.records import DeadLetter

PREFIX = "fanout-sink."
REASON = PREFIX + "reason"
STAGE = PREFIX + "stage"
SINK = PREFIX + "sink"
SOURCE_TOPIC = PREFIX + "source.topic"
SOURCE_PARTITION = PREFIX + "source.partition"
SOURCE_OFFSET = PREFIX + "source.offset"
SOURCE_TIMESTAMP = PREFIX + "source.timestamp"
TABLE = PREFIX + "table"
COLUMN = PREFIX + "column"

STAGES = ("decode", "route", "convert", "tombstone")
_MAX_REASON = 4000


def dead_letter(
    raw: dict[str, Any],
    *,
    sink: str,
    stage: str,
    reason: str,
    table: str | None = None,
    column: str | None = None,
) -> DeadLetter:
    """A dead letter for one raw record (a row of ``RAW_RECORD_SCHEMA`` as a Python dict)."""
    headers: list[tuple[str, bytes]] = [
        (h["key"], h["value"] if h["value"] is not None else b"") for h in raw.get("headers") or []
    ]
    timestamp = raw.get("timestamp")
    millis = int(timestamp.timestamp() * 1000) if timestamp is not None else -1
    extra = [
        (REASON, reason[:_MAX_REASON]),
        (STAGE, stage),
        (SINK, sink),
        (SOURCE_TOPIC, str(raw.get("topic"))),
        (SOURCE_PARTITION, str(raw.get("partition"))),
        (SOURCE_OFFSET, str(raw.get("offset"))),
        (SOURCE_TIMESTAMP, str(millis)),
    ]
    if table is not None:
        extra.append((TABLE, table))
    if column is not None:
        extra.append((COLUMN, column))
    headers.extend((key, value.encode("utf-8")) for key, value in extra)
    return DeadLetter(key=raw.get("key"), value=raw.get("value"), headers=headers)


def header(letter: DeadLetter, key: str) -> str | None:
    """The (last) value of one of the sink's headers, decoded; None when absent."""
    found = None
    for name, value in letter.headers:
        if name == key:
            found = value.decode("utf-8")
    return found


def publish(producer: Any, topic: str, letters: list[DeadLetter]) -> None:
    """Produce dead letters with a confluent-kafka ``Producer``; call inside the worker's transaction."""
    for letter in letters:
        producer.produce(topic, key=letter.key, value=letter.value, headers=list(letter.headers))
