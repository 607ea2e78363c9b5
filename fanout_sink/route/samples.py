"""``fanout-sink route --sample FILE``: records from a JSON-lines file, as the slices a worker gets.

One record per non-empty line. A line is the record's value (any JSON: an object, an array, a
string, a number), sent as that JSON's text, unless it is an *envelope*: an object that has
``value`` or ``value-base64`` and no keys but those of :data:`ENVELOPE_KEYS`::

    {"id": 1, "kind": "order"}                                 <- a value
    {"value": {"id": 1}, "key": "1", "topic": "orders", "headers": {"source": "web"}}
    {"value": null, "key": "1"}                                <- a tombstone
    {"value-base64": "AAAAAAEC...", "topic": "orders"}         <- raw bytes (Avro, Protobuf)

An envelope's ``key`` is text (UTF-8) or null, ``headers`` an object of text values, ``timestamp``
epoch milliseconds, ``topic`` defaults to the first of ``source.topics``, ``partition`` to 0,
``offset`` to the record's place among its partition's lines (0, 1, ...). A value whose own
fields are exactly such keys is written as an envelope: ``{"value": {"value": 3}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.range_reader import RAW_RECORD_SCHEMA

ENVELOPE_KEYS = frozenset(
    {"value", "value-base64", "key", "headers", "topic", "partition", "offset", "timestamp"}
)
"""The keys of an envelope line; a line with any other key is a value."""

FORMAT_HINT = (
    'each line a record\'s JSON value, or {"value": ..., "key": ..., "topic": ..., "headers": {...}}'
)


class SampleError(FanoutSinkError):
    """A sample file line that is not a record; names the file and line."""


def _envelope(line: Any) -> bool:
    return (
        isinstance(line, dict)
        and bool(line.keys() & {"value", "value-base64"})
        and line.keys() <= ENVELOPE_KEYS
    )


def _value(record: dict[str, Any], where: str) -> bytes | None:
    if "value-base64" in record:
        try:
            return base64.b64decode(record["value-base64"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise SampleError(f"{where}: value-base64 is not base64 ({exc}); {FORMAT_HINT}") from None
    value = record["value"]
    return None if value is None else json.dumps(value, separators=(",", ":")).encode()


def _headers(headers: Any, where: str) -> list[dict[str, Any]] | None:
    if headers is None:
        return None
    if not isinstance(headers, dict) or not all(isinstance(v, str | None) for v in headers.values()):
        raise SampleError(f'{where}: headers must be an object of text values, e.g. {{"source": "web"}}')
    return [{"key": k, "value": None if v is None else v.encode()} for k, v in headers.items()]


def read_sample(path: Path, default_topic: str) -> list[pa.Table]:
    """The file's records as raw slices (:data:`RAW_RECORD_SCHEMA`), one per topic-partition in the
    order each first appears; raises :class:`SampleError` naming the line that is not a record."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SampleError(f"--sample {path}: cannot be read: {exc.strerror or exc}") from None
    now_ms = int(time.time() * 1000)
    slices: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--sample {path} line {number}"
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SampleError(f"{where}: not JSON ({exc.msg}); {FORMAT_HINT}") from None
        record = parsed if _envelope(parsed) else {"value": parsed}
        topic = record.get("topic", default_topic)
        partition = record.get("partition", 0)
        if not isinstance(topic, str) or not isinstance(partition, int):
            raise SampleError(f"{where}: topic must be text and partition an integer")
        rows = slices.setdefault((topic, partition), [])
        offset = record.get("offset", rows[-1]["offset"] + 1 if rows else 0)
        if not isinstance(offset, int) or (rows and offset <= rows[-1]["offset"]):
            raise SampleError(f"{where}: offset {offset!r} must be an integer above the partition's last")
        key = record.get("key")
        if key is not None and not isinstance(key, str):
            key = json.dumps(key, separators=(",", ":"))
        rows.append(
            {
                "key": None if key is None else key.encode(),
                "value": _value(record, where),
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "timestamp": datetime.fromtimestamp(record.get("timestamp", now_ms) / 1000, UTC),
                "timestampType": 0,
                "headers": _headers(record.get("headers"), where),
            }
        )
    return [pa.Table.from_pylist(rows, schema=RAW_RECORD_SCHEMA) for rows in slices.values()]
