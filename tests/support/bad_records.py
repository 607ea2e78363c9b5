"""The bad-input corpus: records a producer can send that the sink must not choke on.

Each :class:`BadRecord` is the raw Kafka record (key, value, headers) and what the sink must make
of it: the dead-letter stage and a substring of the reason (plus the table and column where the
failure belongs to one). The unit test (tests/transform/test_bad_input.py) runs every case through the real
slice processor; the app test (tests/e2e/test_bad_input_app.py) produces them to a real topic; both
check each dead letter with :func:`assert_dead_letter`. The Confluent Avro cases (unknown schema
ids, broken frames) live in tests/transform/test_bad_input.py, next to the Schema Registry they need.

Both use the sink of :func:`sink_settings`: JSON values; ``type == 'order'`` goes to the static
table ``shop.orders`` (schemas/tables/orders.avsc: ``id`` and ``ts`` required, ``total`` a
decimal(12, 2) that ``amount`` maps to); other records are routed by their ``table`` field to a
dynamic table allowed by ``^raw\\.[a-z][a-z0-9_]*$``; records with neither are dropped (filtered).
Good records (:func:`good_record`) go to ``shop.orders`` and ``raw.click`` or are filtered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fanout_sink.transform import deadletter
from fanout_sink.transform.records import DeadLetter

REPO = Path(__file__).resolve().parents[2]
ORDERS = "shop.orders"
CLICKS = "raw.click"
_TS = "2024-05-01T10:00:00Z"


@dataclass(frozen=True)
class BadRecord:
    """One bad record and the dead letter it must become."""

    name: str
    value: bytes | None
    stage: str
    reason: str
    """A substring of the ``fanout-sink.reason`` header."""
    table: str | None = None
    column: str | None = None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def error(self) -> bool:
        """Bad data (stops the sink under ``errors.tolerance: none``), not a dead letter by policy."""
        return self.stage != "tombstone"


def sink_settings(**overrides: Any) -> dict[str, Any]:
    """The corpus sink's YAML as a dict, without name, kafka, catalog and spark (callers add them)."""
    settings: dict[str, Any] = {
        "source": {"topics": ["events"], "format": "json", "tombstones": "dead-letter"},
        "tables": {
            ORDERS: {
                "when": "type == 'order'",
                "schema": str(REPO / "schemas" / "tables" / "orders.avsc"),
                "conversion": {"name-mapping": {"total": ["amount"]}},
            }
        },
        "dynamic": {"table": "table", "allow": r"^raw\.[a-z][a-z0-9_]*$", "auto-create": True},
        "unmatched": {"action": "drop"},
        "dead-letter": {"topic": "dlq"},
        "errors": {"tolerance": "all"},
    }
    settings.update(overrides)
    return settings


def good_record(i: int) -> tuple[bytes, str | None]:
    """The ``i``-th good value and the table it lands in (None: filtered, routed nowhere)."""
    kind = i % 3
    if kind == 0:
        return _json({"type": "order", "id": i, "ts": _TS, "amount": "12.50", "customer": f"c{i}"}), ORDERS
    if kind == 1:
        return _json({"table": CLICKS, "id": i, "page": "/home"}), CLICKS
    return _json({"type": "ping", "id": i}), None


def _json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _order(**fields: Any) -> bytes:
    return _json({"type": "order", "id": 1, "ts": _TS, **fields})


def _routed(table: str) -> bytes:
    return _json({"table": table, "id": 1})


def _deep(levels: int) -> bytes:
    return (
        b'{"type": "order", "id": 1, "ts": "'
        + _TS.encode()
        + b'", "x": '
        + b"[" * levels
        + b"]" * levels
        + b"}"
    )


_LATIN1 = _order()[:-1] + b', "customer": "caf\xe9"}'

HUGE_STRING_BYTES = 3 * 1024 * 1024
"""The multi-MB case: topics and producers in the app test must allow messages this large."""

CASES: tuple[BadRecord, ...] = (
    # malformed JSON
    BadRecord(
        "truncated", b'{"type": "order", "id": 1, "ts": "2024', "decode", "invalid JSON: Unterminated string"
    ),
    BadRecord("trailing garbage", _order() + b" trailing", "decode", "invalid JSON: Extra data"),
    BadRecord("two objects", _order() + _order(), "decode", "invalid JSON: Extra data"),
    BadRecord("array, not an object", b"[1, 2, 3]", "decode", "value is a JSON array, not an object"),
    BadRecord("string, not an object", b'"order"', "decode", "value is a JSON string, not an object"),
    BadRecord("empty value", b"", "decode", "invalid JSON: Expecting value"),
    BadRecord("NaN", _order()[:-1] + b', "amount": NaN}', "decode", "NaN is not a JSON value"),
    BadRecord(
        "Infinity", _order()[:-1] + b', "amount": -Infinity}', "decode", "-Infinity is not a JSON value"
    ),
    # invalid UTF-8
    BadRecord(
        "UTF-16 with BOM",
        json.dumps({"type": "order", "id": 1, "ts": _TS}).encode("utf-16"),
        "decode",
        "value is not UTF-8: byte 0xff at offset 0",
    ),
    BadRecord(
        "Latin-1 byte",
        _LATIN1,
        "decode",
        f"value is not UTF-8: byte 0xe9 at offset {_LATIN1.index(0xE9)}",
        key=b"\xff\xfe-key",
        headers=(("trace", b"\x00\xff"),),
    ),
    BadRecord(
        "unpaired surrogate",
        _order()[:-1] + b', "customer": "\\ud800"}',
        "decode",
        "unpaired surrogate escape (\\ud800)",
    ),
    # wrong types
    BadRecord("string id", _order(id="abc"), "convert", "column 'id': cannot convert 'abc'", ORDERS, "id"),
    BadRecord(
        "object id", _order(id={"n": 1}), "convert", "column 'id': cannot convert '{\"n\": 1}'", ORDERS, "id"
    ),
    BadRecord(
        "bad timestamp", _order(ts="yesterday"), "convert", "column 'ts': cannot convert", ORDERS, "ts"
    ),
    BadRecord(
        "bad decimal", _order(amount="twelve"), "convert", "column 'total': cannot convert", ORDERS, "total"
    ),
    # huge values
    BadRecord(
        "multi-MB string id",
        _order(id="9" * HUGE_STRING_BYTES),
        "convert",
        "column 'id': cannot convert '99999",
        ORDERS,
        "id",
    ),
    BadRecord(
        "integer beyond int64",
        b'{"type": "order", "ts": "2024-05-01", "id": 123456789012345678901234567890}',
        "convert",
        "123456789012345678901234567890",
        ORDERS,
        "id",
    ),
    BadRecord(
        "decimal too wide",
        _order(amount="123456789012345678901.25"),
        "convert",
        "column 'total': cannot convert '123456789012345678901.25'",
        ORDERS,
        "total",
    ),
    # deep nesting
    BadRecord(
        "30 000 levels deep", _deep(30_000), "decode", "value nests 30001 levels deep; the limit is 64"
    ),
    # nulls in required columns
    BadRecord("null id", _order(id=None), "convert", "required column 'id' is missing or null", ORDERS, "id"),
    BadRecord(
        "missing ts",
        _json({"type": "order", "id": 1}),
        "convert",
        "required column 'ts' is missing or null",
        ORDERS,
        "ts",
    ),
    # tombstones
    BadRecord("tombstone", None, "tombstone", "tombstone (null value)", key=b"deleted-key"),
    # hostile dynamic table names
    BadRecord("path traversal", _routed("../../etc"), "route", "contains a path separator"),
    BadRecord("SQL injection", _routed("raw.a;DROP TABLE x"), "route", "may hold only a-z, 0-9 and _"),
    BadRecord("empty name", _routed(""), "route", "has an empty part"),
    BadRecord("unicode name", _routed("raw.k\u00fcche"), "route", "may hold only a-z, 0-9 and _"),
    BadRecord("control character", _routed("raw.a\x00b"), "route", "contains control characters"),
    BadRecord(
        "300 characters", _routed("raw." + "a" * 296), "route", "is 300 characters long; the limit is 128"
    ),
    BadRecord("a dot too many", _routed("raw.a.b"), "route", "is 2 namespaces deep"),
    BadRecord("fails dynamic.allow", _routed("secret.passwords"), "route", "does not match dynamic.allow"),
)


def interleaved(cases: tuple[BadRecord, ...] = CASES) -> list[BadRecord | int]:
    """Bad records each between two good ones (given by their :func:`good_record` index)."""
    entries: list[BadRecord | int] = [0]
    for i, case in enumerate(cases, start=1):
        entries += [case, i]
    return entries


def assert_dead_letter(letter: DeadLetter, case: BadRecord, topic: str, partition: int, offset: int) -> None:
    """``letter`` is ``case``'s dead letter: original record, stage, reason, table, column, coordinates."""

    def header(key: str) -> str | None:
        return deadletter.header(letter, key)

    reason = header(deadletter.REASON) or ""
    assert header(deadletter.STAGE) == case.stage, case.name
    assert case.reason in reason and len(reason) <= 4000, (case.name, reason[:300])
    assert (header(deadletter.TABLE), header(deadletter.COLUMN)) == (case.table, case.column), case.name
    assert header(deadletter.SOURCE_TOPIC) == topic and header(deadletter.SOURCE_PARTITION) == str(partition)
    assert header(deadletter.SOURCE_OFFSET) == str(offset), case.name
    assert (letter.key, letter.value) == (case.key, case.value), case.name
    assert letter.headers[: len(case.headers)] == list(case.headers), case.name
