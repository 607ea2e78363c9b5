"""A change table's records (``changes:``): which are upserts and deletes, and each key's last change.

A change table keeps one row per key. Within a slice (one topic-partition, offsets ascending) a
key may change several times; only its last change -- the highest offset -- reaches the table:
its row when that change is an upsert, its key in the deleted keys when it is a delete. The other
changes of the key are *superseded*: they were true once, but the table never shows them. All of
this is whole-column Arrow: one ``group_by(key).aggregate(max)`` per table and slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.config.tables import ChangeSettings
from fanout_sink.transform import debezium
from fanout_sink.transform.convert import Matching
from fanout_sink.transform.expressions import Predicate
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.record_view import RecordView

_ORDER = " order"
"""The position column of :func:`last_change_wins`; a space keeps it from meeting a key column."""


@dataclass(frozen=True)
class Changes:
    """A table's records as changes: the row image of each upsert or delete, ``select``-able."""

    images: RecordView
    """One record per upsert or delete."""
    positions: np.ndarray
    """Each image's position in the table's view."""
    deletes: np.ndarray
    """Per image: whether it deletes its key."""
    truncates: np.ndarray
    """Positions (in the table's view) of Debezium truncate events."""
    bad: list[tuple[int, str]]
    """Positions (in the table's view) of records that are no change, with the reason."""


def read_changes(
    view: RecordView, settings: ChangeSettings, delete_when: Predicate | None, vectorised: bool
) -> Changes:
    """The changes in ``view`` (one table's records): Debezium events by their ``op``; upsert
    records are upserts unless ``delete_when`` (evaluated on the record, as ``when`` is) holds."""
    if settings.format == "debezium":
        ops = debezium.classify(view.records, view.decoded.python)
        images, positions = debezium.row_images(view.records, view.decoded.python, ops.upserts, ops.deletes)
        deletes = np.isin(positions, ops.deletes)
        return Changes(view.with_records(positions, images), positions, deletes, ops.truncates, ops.bad)
    none = np.zeros(0, dtype=np.int64)
    if delete_when is None:
        return Changes(view, np.arange(len(view)), np.zeros(len(view), dtype=bool), none, [])
    matches = delete_when.evaluate(view, vectorised)
    if not matches.failed:
        return Changes(view, np.arange(len(view)), matches.mask, none, [])
    # A record delete-when raised on is neither an upsert nor a delete: a bad record.
    bad = [
        (pos, f"delete-when {delete_when.expression!r} failed: {problem}") for pos, problem in matches.failed
    ]
    keep = np.ones(len(view), dtype=bool)
    keep[[pos for pos, _ in bad]] = False
    images = view.subset(np.flatnonzero(keep))
    positions = images.decoded.rows
    return Changes(images, positions, matches.mask[positions], none, bad)


def message_key_columns(
    view: RecordView, table_key: tuple[str, ...] | None
) -> tuple[tuple[str, ...], list[tuple[int, str]]]:
    """The key columns of a change table keyed by its records' Kafka message keys, and the records
    (positions in ``view``) whose message key does not give them, with the reason.

    Debezium keys each event by its row's primary key: ``{"id": 1}``, or Connect's
    ``{"schema": ..., "payload": {"id": 1}}``; the fields a message key holds (in their order) name
    the key columns, whose values are read from the row image like any key's. The key columns
    belong to the table: an existing table's identifier fields (``table_key``), else, for the table
    the slice creates, the fields most of its message keys hold (the first such shape on a tie). A
    record whose message key holds other fields is the bad one, not every record beside it.
    """
    keys = view.meta.column("key").combine_chunks()
    decoded = debezium.unwrap_connect_json(JsonDecoder()(keys.cast(pa.binary()), None))
    hint = "with no changes.key set, the key columns are the fields of the message key"
    bad = [
        (int(p), f"the Kafka message key is no JSON object ({reason}); {hint}")
        for p, reason in decoded.failures
    ]
    fields = decoded.records.column_names
    held = np.zeros(len(decoded.rows), dtype=np.int64)  # per record: a bit per field its key holds
    for bit, name in enumerate(fields):
        valid = decoded.records.column(name).is_valid().to_numpy(zero_copy_only=False)
        held |= valid.astype(np.int64) << bit
    shapes, first, counts = np.unique(held, return_index=True, return_counts=True)
    if table_key is not None:
        key, origin = table_key, "the table's identifier fields"
        wanted = sum(1 << fields.index(name) for name in key) if set(key) <= set(fields) else -1
    elif (shapes != 0).any():
        usable = shapes != 0
        # The most common shape; on a tie, the one seen first.
        wanted = int(shapes[usable][np.lexsort((first[usable], -counts[usable]))[0]])
        key = tuple(name for bit, name in enumerate(fields) if wanted >> bit & 1)
        origin = "the fields most of the slice's message keys hold"
    else:
        key, origin, wanted = (), "", -1
    for shape in shapes[shapes != wanted].tolist():
        names = [name for bit, name in enumerate(fields) if shape >> bit & 1]
        if names:
            reason = (
                f"the Kafka message key names {names}, but the table's key is {list(key)} ({origin}); "
                f"{hint}: produce this record with the table's key, or set changes.key"
            )
        else:
            reason = f"the Kafka message key names no field; {hint}"
        bad += [(int(p), reason) for p in decoded.rows[held == shape].tolist()]
    bad.sort()
    return key, bad


def null_keys(rows: pa.Table, key: tuple[str, ...], matching: Matching) -> list[tuple[int, str, str]]:
    """Rows of ``rows`` (a change table's rows before conversion) without a value for a key column:
    ``(position, column, reason)``. A change without its key cannot be applied to any row."""
    found: dict[int, tuple[str, str]] = {}
    for column in key:
        source = matching.find(rows.column_names, column, column)
        if source is None:
            missing = np.arange(rows.num_rows)
            reason = f"key column {column!r} is missing"
        else:
            missing = np.flatnonzero(np.asarray(rows.column(source).is_null().to_numpy(zero_copy_only=False)))
            reason = f"key column {column!r} is null"
        for position in missing.tolist():
            found.setdefault(position, (column, reason))
    return sorted((p, c, f"{r}; every change needs its key to be applied") for p, (c, r) in found.items())


def last_change_wins(
    upsert_keys: pa.Table, upsert_order: np.ndarray, delete_keys: pa.Table, delete_order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which upserts and deletes are their key's last change: positions into each.

    ``*_keys`` hold the key columns in the table's types (no nulls), ``*_order`` each change's
    position in the slice (distinct; higher is later). A key's changes are compared across both.
    """
    keys = pa.concat_tables([upsert_keys, delete_keys.select(upsert_keys.column_names)])
    order = np.concatenate([upsert_order, delete_order]).astype(np.int64)
    if keys.num_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    grouped = keys.append_column(_ORDER, pa.array(order)).group_by(keys.column_names, use_threads=False)
    latest = grouped.aggregate([(_ORDER, "max")]).column(f"{_ORDER}_max")
    wins = np.flatnonzero(
        pc.is_in(pa.array(order), value_set=latest.combine_chunks()).to_numpy(zero_copy_only=False)
    )
    split = len(upsert_order)
    return wins[wins < split], wins[wins >= split] - split
