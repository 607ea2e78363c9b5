"""The change benchmark's input: a Debezium change stream over a key space, and the state it leaves.

A source table ``crm.customers`` of ``keys`` rows (ids 1..K) exists before the stream; both systems
start from it, loaded into their table (:func:`initial_rows`). Then ``events`` changes follow: by
default 70% updates of a key that exists at that point, 20% inserts of new keys (K+1, K+2, ...), 10%
deletes. A key is drawn for an update or delete uniformly among the ids inserted so far; a draw
that hit a key deleted by then is drawn again (a few rounds). The stream stays what Debezium would
capture (``before`` is always the row as it was): a change left on a deleted key becomes an insert
of that id again (op ``c``), and the final shares are reported (:attr:`ChangeStream.ops`), not
assumed.

Everything is generated column-wise (numpy draws, Arrow string joins): the JSON of 2M envelopes is
built without a Python object per record. The envelopes are Debezium's plain JSON (the converter's
``schemas.enable=false``) for a PostgreSQL source: ``amount`` in ``decimal.handling.mode=string``,
``updated_at`` a ``timestamptz`` column (``io.debezium.time.ZonedTimestamp``, ISO-8601 text). The
Kafka message key is ``{"id": <id>}``, as Debezium keys by primary key, so a key's changes stay in
one partition. No tombstones (``tombstones.on.delete=false``): each message is one change event.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

NAMESPACE = "crm"
SOURCE_TABLE = "customers"
TABLE = f"{NAMESPACE}.{SOURCE_TABLE}"
KEY = "id"
UPDATE, INSERT, DELETE = 0, 1, 2
OP_CODES = ("u", "c", "d")
MERGE_ON_READ = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
"""Properties of the table both systems write: format v2, Spark's row-level writes as position deletes."""

_FIRST = ["Ada", "Ben", "Chloe", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Luis"]
_LAST = ["Nakamura", "Okafor", "Petrov", "Quinn", "Rossi", "Schmidt", "Tanaka", "Usman", "Vargas", "Weber"]
_COUNTRIES = ["DE", "FR", "NL", "PL", "SE", "ES", "IT", "US", "GB", "JP"]
_STATUSES = ["active", "pending", "suspended", "vip"]
_REDRAWS = 8
_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the first change; the initial rows are older
_SOURCE = '"source":{"version":"2.7.3.Final","connector":"postgresql","name":"dbserver1","ts_ms":'

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "email", StringType(), required=False),
    NestedField(4, "country", StringType(), required=False),
    NestedField(5, "status", StringType(), required=False),
    NestedField(6, "amount", DecimalType(12, 2), required=False),
    NestedField(7, "points", IntegerType(), required=False),
    NestedField(8, "updated_at", TimestamptzType(), required=False),
    identifier_field_ids=[1],
)
"""The source table's columns, as both systems' Iceberg table has them (``id`` its identifier field)."""
COLUMNS = [field.name for field in SCHEMA.fields]


@dataclass(frozen=True)
class ChangePlan:
    """How big the stream is and how its changes split; ``seed`` makes it the same bytes every time."""

    keys: int = 1_000_000
    events: int = 2_000_000
    updates: float = 0.7
    inserts: float = 0.2
    deletes: float = 0.1
    seed: int = 23

    def __post_init__(self) -> None:
        if self.keys < 1 or self.events < 1:
            raise ValueError(f"keys and events must be at least 1, got {self.keys} and {self.events}")
        if abs(self.updates + self.inserts + self.deletes - 1) > 1e-9:
            raise ValueError("the shares of updates, inserts and deletes must add up to 1")


@dataclass(frozen=True)
class ChangeStream:
    """The messages to produce, in order, and what a correct replica holds after them."""

    plan: ChangePlan
    keys: pa.Array
    """Kafka message keys, ``{"id":n}`` (JSON text)."""
    values: pa.Array
    """Debezium envelopes (JSON text), one per change."""
    ops: dict[str, int]
    """Changes per op (``c``, ``u``, ``d``) as generated, after the re-insert rule."""
    initial: pa.Table
    """The source table before the stream (``SCHEMA``'s Arrow types, sorted by id)."""
    final: pa.Table
    """The model: every live key's last row after the stream (sorted by id)."""

    def batches(self, size: int = 100_000) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """(keys, values) as bytes, ``size`` messages at a time: the producer needs Python bytes,
        and all 2M at once would double the stream's memory."""
        for start in range(0, len(self.values), size):
            keys = self.keys.slice(start, size).cast(pa.binary()).to_pylist()
            values = self.values.slice(start, size).cast(pa.binary()).to_pylist()
            yield keys, values


def _join(*parts: pa.Array | str) -> pa.Array:
    """Element-wise concatenation of string arrays and literals (nulls propagate)."""
    return pc.binary_join_element_wise(*parts, "")


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


@dataclass(frozen=True)
class _Versions:
    """Every row image of the run, one per version: 0..K-1 the initial rows, K+j event j's ``after``."""

    rows: pa.Table
    json: pa.Array


def _versions(ids: np.ndarray, rng: np.random.Generator, updated_ms: np.ndarray) -> _Versions:
    n = len(ids)
    first = pa.array(np.array(_FIRST)[rng.integers(len(_FIRST), size=n)])
    last = pa.array(np.array(_LAST)[rng.integers(len(_LAST), size=n)])
    country = pa.array(np.array(_COUNTRIES)[rng.integers(len(_COUNTRIES), size=n)])
    status = pa.array(np.array(_STATUSES)[rng.integers(len(_STATUSES), size=n)])
    cents = rng.integers(0, 10_000_000, size=n)
    points = rng.integers(0, 50_000, size=n).astype(np.int32)
    id_text = _text(ids)
    name = _join(first, " ", last)
    email = _join(pc.utf8_lower(first), ".", pc.utf8_lower(last), id_text, "@example.com")
    amount = _join(_text(cents // 100), ".", pc.utf8_lpad(_text(cents % 100), 2, "0"))
    updated = pa.array(updated_ms, pa.timestamp("ms", tz="UTC"))
    updated_text = pc.strftime(updated, format="%Y-%m-%dT%H:%M:%SZ")  # %S carries the milliseconds
    rows = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": name,
            "email": email,
            "country": country,
            "status": status,
            "amount": pc.cast(amount, pa.decimal128(12, 2)),
            "points": pa.array(points, pa.int32()),
            "updated_at": updated.cast(pa.timestamp("us", tz="UTC")),
        }
    )
    json = _join(
        '{"id":', id_text, ',"name":"', name, '","email":"', email, '","country":"', country,
        '","status":"', status, '","amount":"', amount, '","points":', _text(points),
        ',"updated_at":"', updated_text, '"}',
    )  # fmt: skip
    return _Versions(rows, json)


def _relabel(key: np.ndarray, op: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ops as Debezium would capture them, and each event's previous version (-1: none).

    Works on the events sorted by (key, position). Within a key, consecutive deletes alternate
    between a real delete and a re-insert; any other change right after a real delete is a
    re-insert. The previous version of an event is the one before it of its key, else the key's
    initial row (ids up to K; a new id's first event is its insert).
    """
    n = len(key)
    order = np.argsort(key, kind="stable")
    sorted_key, sorted_op = key[order], op[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_key[1:] != sorted_key[:-1]
    index = np.arange(n)
    is_delete = sorted_op == DELETE
    # Where the run of deletes that index i belongs to starts: after the last non-delete of its key.
    marker = np.where(~is_delete, index + 1, np.where(first, index, -1))
    run_position = index - np.maximum.accumulate(marker) + 1
    real_delete = is_delete & (run_position % 2 == 1)
    after_delete = np.zeros(n, dtype=bool)
    after_delete[1:] = real_delete[:-1] & ~first[1:]
    fixed = sorted_op.copy()
    fixed[(is_delete & ~real_delete) | (~is_delete & after_delete)] = INSERT
    previous = np.empty(n, dtype=np.int64)
    previous[1:] = order[:-1]
    previous[first] = -1
    relabelled = np.empty(n, dtype=op.dtype)
    relabelled[order] = fixed
    before = np.empty(n, dtype=np.int64)
    before[order] = previous
    return relabelled, before


def generate(plan: ChangePlan) -> ChangeStream:
    """The stream and its model, deterministic for a plan (same seed, same bytes)."""
    rng = np.random.default_rng(plan.seed)
    k, n = plan.keys, plan.events
    drawn = rng.choice(3, size=n, p=[plan.updates, plan.inserts, plan.deletes]).astype(np.int8)
    inserting = drawn == INSERT
    inserted_before = np.cumsum(inserting) - inserting
    key = np.empty(n, dtype=np.int64)
    key[inserting] = k + 1 + np.arange(int(inserting.sum()))
    # Uniform among the ids that exist at that point: 1..K and the new ids inserted before. A draw
    # that hit a key deleted by then is drawn again, a few rounds, so the shares stay near the plan's.
    stray = ~inserting
    for _ in range(_REDRAWS):
        key[stray] = 1 + np.floor(rng.random(int(stray.sum())) * (k + inserted_before[stray])).astype(
            np.int64
        )
        op, previous_event = _relabel(key, drawn)
        stray = op != drawn
        if not stray.any():
            break

    ids = np.concatenate([np.arange(1, k + 1, dtype=np.int64), key])
    updated_ms = np.concatenate([_BASE_MS - 1000 * np.arange(k, 0, -1), _BASE_MS + 5 * np.arange(n)])
    versions = _versions(ids, rng, updated_ms)
    event_version = k + np.arange(n)
    # The previous image: the key's previous event, else its initial row; none for an insert.
    before_version = np.where(previous_event >= 0, k + previous_event, key - 1)
    has_before = op != INSERT
    before = pc.fill_null(versions.json.take(pa.array(before_version, mask=~has_before)), "null")
    after = pc.fill_null(versions.json.take(pa.array(event_version, mask=op == DELETE)), "null")
    source_ms = _text(updated_ms[k:])
    op_text = pa.array(np.array(OP_CODES)[op])
    values = _join(
        '{"before":', before, ',"after":', after, ",", _SOURCE, source_ms,
        ',"snapshot":"false","db":"crm","schema":"public","table":"', SOURCE_TABLE, '","lsn":',
        _text(24_000_000 + 64 * np.arange(n)), '},"op":"', op_text, '","ts_ms":',
        _text(updated_ms[k:] + 40), "}",
    )  # fmt: skip
    message_keys = _join('{"id":', _text(key), "}")

    # The model: per key, the last event decides (a delete: gone); untouched ids keep their initial row.
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = sorted_key[:-1] != sorted_key[1:]
    last_events = order[last]
    untouched = np.setdiff1d(np.arange(1, k + 1, dtype=np.int64), sorted_key[last], assume_unique=True)
    kept = last_events[op[last_events] != DELETE]
    final_versions = np.concatenate([untouched - 1, k + kept])
    final = versions.rows.take(pa.array(final_versions)).sort_by(KEY)
    counts = np.bincount(op, minlength=3)
    return ChangeStream(
        plan=plan,
        keys=message_keys,
        values=values,
        ops={code: int(counts[i]) for i, code in enumerate(OP_CODES)},
        initial=versions.rows.slice(0, k),
        final=final,
    )


def create_table(catalog: Any, initial: pa.Table, name: str = TABLE) -> None:
    """The replica's table, format v2 with merge-on-read, holding the source's rows before the stream
    (``name``: the chaos run keeps it beside its other tables)."""
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    table = catalog.create_table(name, schema=SCHEMA, properties=MERGE_ON_READ)
    table.append(initial.cast(table.schema().as_arrow()))
