"""Dead letters: the original key, value and headers of a record, plus headers saying why.

Header keys (values are UTF-8 text):

=============================  ===============================================================
``fanout-sink.reason``          what went wrong and, where it helps, what to do
``fanout-sink.stage``           ``decode``, ``route``, ``convert``, ``tombstone`` or ``truncate``
``fanout-sink.sink``            the sink's ``name``
``fanout-sink.source.topic``    source topic
``fanout-sink.source.partition`` source partition
``fanout-sink.source.offset``   source offset
``fanout-sink.source.timestamp`` source timestamp, epoch milliseconds
``fanout-sink.table``           destination table (convert stage; routing of a dynamic name)
``fanout-sink.column``          the column that failed (convert stage)
``fanout-sink.truncated``       what was cut to fit the message size limit: ``value``, ``key``,
                                ``headers`` (the source record's own), comma-separated
``fanout-sink.original.key.size``   the key's size in bytes before truncation (truncated only)
``fanout-sink.original.value.size`` the value's size in bytes before truncation (truncated only)
=============================  ===============================================================

With ``dead-letter.connect-headers: true`` (Kafka Connect's ``errors.deadletterqueue.context.
headers.enable``), a dead letter also carries Kafka Connect's ``__connect.errors.*`` headers, UTF-8
text as Connect writes them (:func:`connect_headers`; the mapping is in ``routing/README.md``), so
tooling written for Connect's dead-letter queues reads ours.

The worker produces these inside its Kafka transaction, so a dead letter is published exactly
when the slice's offsets are committed. A dead letter that would not fit the producer's
``message.max.bytes`` or the dead-letter topic's ``max.message.bytes`` would fail that transaction
on every retry, even under ``errors.tolerance: all``; :func:`fit` cuts it to size instead (the
value first, then the key, then the source record's headers), says so in the headers above, and
:func:`publish` logs it. The cut keeps the beginning of each part, which is usually enough to find
the record in the source topic by its coordinates.
"""

from __future__ import annotations

import logging
from typing import Any

from fanout_sink.transform.records import DeadLetter

log = logging.getLogger(__name__)

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
TRUNCATED = PREFIX + "truncated"
ORIGINAL_KEY_SIZE = PREFIX + "original.key.size"
ORIGINAL_VALUE_SIZE = PREFIX + "original.value.size"

CONNECT_PREFIX = "__connect.errors."
"""Kafka Connect's ``DeadLetterQueueReporter`` header prefix (``__connect`` + ``.errors.``)."""
CONNECT_STAGES = {
    "decode": "VALUE_CONVERTER",
    "route": "TRANSFORMATION",
    "convert": "TASK_PUT",
    "tombstone": "TASK_PUT",
    "truncate": "TASK_PUT",
}
"""Our stage as the name of Connect's ``Stage`` enum constant where Connect would have failed."""
CONNECT_EXCEPTION = "fanout_sink.errors.RecordError"
"""The error the sink raises for the same record under ``errors.tolerance: none``."""

# Bytes a record costs on the wire beyond its key, value and header bytes: the record batch header
# (61) and the record's and each header's varint framing, rounded up generously.
_RECORD_OVERHEAD = 512
_HEADER_OVERHEAD = 10

STAGES = ("decode", "route", "convert", "tombstone", "truncate")
_MAX_REASON = 4000


def dead_letter(
    raw: dict[str, Any],
    *,
    sink: str,
    stage: str,
    reason: str,
    table: str | None = None,
    column: str | None = None,
    connect_class: str | None = None,
) -> DeadLetter:
    """A dead letter for one raw record (a row of ``RAW_RECORD_SCHEMA`` as a Python dict); with
    ``connect_class`` (the class that failed on it), Kafka Connect's headers too."""
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
    if connect_class is not None:
        where = ", ".join(
            f"{name} {value}" for name, value in (("table", table), ("column", column)) if value
        )
        message = f"record {raw.get('topic')}[{raw.get('partition')}]@{raw.get('offset')} failed at {stage}: "
        message += reason[:_MAX_REASON] + (f" ({where})" if where else "")
        context = connect_headers(raw, sink=sink, stage=stage, executing=connect_class, message=message)
        present = {name for name, _ in headers}
        # As Connect's reporter does: a header the record already carries is kept, not added twice.
        headers.extend((name, value) for name, value in context if name not in present)
    return DeadLetter(key=raw.get("key"), value=raw.get("value"), headers=headers)


def connect_headers(
    raw: dict[str, Any], *, sink: str, stage: str, executing: str, message: str
) -> list[tuple[str, bytes]]:
    """Kafka Connect's dead-letter context headers for one raw record, encoded as Connect's
    ``DeadLetterQueueReporter`` encodes them: every value UTF-8 text, numbers in decimal.

    ``task.id`` is the source partition (one Spark task delivers one topic-partition's range); the
    stack trace is the first line a Java stack trace starts with (``class: message``): the failure was
    found by a vectorised check, not raised, so there are no frames to show.
    """
    values = {
        "topic": str(raw.get("topic")),
        "partition": str(raw.get("partition")),
        "offset": str(raw.get("offset")),
        "connector.name": sink,
        "task.id": str(raw.get("partition")),
        "stage": CONNECT_STAGES[stage],
        "class.name": executing,
        "exception.class.name": CONNECT_EXCEPTION,
        "exception.message": message,
        "exception.stacktrace": f"{CONNECT_EXCEPTION}: {message}\n",
    }
    return [(CONNECT_PREFIX + name, value.encode("utf-8")) for name, value in values.items()]


def header(letter: DeadLetter, key: str) -> str | None:
    """The (last) value of one of the sink's headers, decoded; None when absent."""
    found = None
    for name, value in letter.headers:
        if name == key:
            found = value.decode("utf-8")
    return found


def _headers_size(headers: list[tuple[str, bytes]]) -> int:
    return sum(len(key.encode("utf-8")) + len(value) + _HEADER_OVERHEAD for key, value in headers)


def wire_size(letter: DeadLetter) -> int:
    """An upper bound of the bytes one dead letter takes in a record batch of its own."""
    return (
        _RECORD_OVERHEAD + len(letter.key or b"") + len(letter.value or b"") + _headers_size(letter.headers)
    )


def fit(letter: DeadLetter, max_bytes: int) -> DeadLetter:
    """``letter`` itself when it fits in ``max_bytes``, else a copy cut to fit, with headers saying so.

    The value gives way first; the key keeps at least half the room the value does not need; the
    source record's own headers are dropped only when they alone are too large.
    """
    if wire_size(letter) <= max_bytes:
        return letter
    key, value = letter.key or b"", letter.value or b""
    sizes = [(ORIGINAL_KEY_SIZE, str(len(key)).encode()), (ORIGINAL_VALUE_SIZE, str(len(value)).encode())]
    longest_marker = (TRUNCATED, b"value,key,headers")
    headers = list(letter.headers)
    dropped_headers = False

    def room_for(kept: list[tuple[str, bytes]]) -> int:
        return max_bytes - _RECORD_OVERHEAD - _headers_size([*kept, longest_marker, *sizes])

    if room_for(headers) < 0:
        headers = [(name, data) for name, data in headers if name.startswith((PREFIX, CONNECT_PREFIX))]
        dropped_headers = True
    room = max(room_for(headers), 0)
    key_room = min(len(key), max(room // 2, room - len(value)))
    value_room = min(len(value), room - key_room)
    cut = [
        part
        for part, kept, size in (("value", value_room, len(value)), ("key", key_room, len(key)))
        if kept < size
    ]
    cut += ["headers"] if dropped_headers else []
    return DeadLetter(
        key=None if letter.key is None else key[:key_room],
        value=None if letter.value is None else value[:value_room],
        headers=[*headers, (TRUNCATED, ",".join(cut).encode()), *sizes],
    )


def publish(producer: Any, topic: str, letters: list[DeadLetter], max_bytes: int) -> int:
    """Produce dead letters, each cut to ``max_bytes`` if needed; the number that were cut.

    ``producer`` has confluent-kafka's ``produce(topic, key=, value=, headers=)``; call inside the
    worker's transaction. ``max_bytes`` is the smaller of the producer's ``message.max.bytes`` and the
    topic's ``max.message.bytes``.
    """
    cut = 0
    for letter in letters:
        sent = fit(letter, max_bytes)
        if sent is not letter:
            cut += 1
            log.warning(
                "dead letter of %s[%s]@%s is %d bytes, more than the %d a message may have on %r: "
                "sent truncated (%s=%s)",
                header(letter, SOURCE_TOPIC),
                header(letter, SOURCE_PARTITION),
                header(letter, SOURCE_OFFSET),
                wire_size(letter),
                max_bytes,
                topic,
                TRUNCATED,
                header(sent, TRUNCATED),
            )
        producer.produce(topic, key=sent.key, value=sent.value, headers=list(sent.headers))
    return cut
