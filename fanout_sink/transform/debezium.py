"""Debezium change events: the Kafka Connect JSON wrapper, Connect logical types, row images.

Debezium writes one event per row change: ``op`` (``c`` create, ``r`` snapshot read, ``u`` update,
``d`` delete, ``t`` truncate), the row ``before`` and ``after`` the change, and ``source`` (database,
table, position). Kafka Connect's ``JsonConverter`` with ``schemas.enable`` wraps each event as
``{"schema": ..., "payload": <event>}``; :func:`unwrap_connect_json` reads the payload as the event
and keeps what the wrapper's schema says of the row's columns (their Connect logical type, e.g.
``io.debezium.time.Date`` on an ``int32``) as Arrow field metadata of ``before``/``after``, so
that :func:`row_images` can give each column its real type (:func:`apply_logical_types`): dates,
timestamps, times and decimals instead of the integers, strings and base64 text they travel as.
Registry formats (Avro, Protobuf, JSON Schema) decode to the same event shape without a wrapper;
Avro's ``connect.name`` annotations become the same field metadata
(:data:`~fanout_sink.avro_schema.CONNECT_NAME`).

Everything is whole-column Arrow but for ``Decimal``: its base64 big-endian bytes are read per
value (Arrow has no base64 kernel), only for the columns that are decimals.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.avro_schema import CONNECT_NAME
from fanout_sink.transform.formats.decoded import Decoded, arrow_from_python

log = logging.getLogger(__name__)

IMAGES = ("before", "after")
"""The event fields that hold a row image."""

CONNECT_SCALE = b"connect.scale"
CONNECT_PRECISION = b"connect.precision"

_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def unwrap_connect_json(decoded: Decoded) -> Decoded:
    """``decoded`` with ``{"schema", "payload"}`` records replaced by their payloads (the events),
    the schema's logical types kept as field metadata; other records are returned as they are.

    Only a batch whose every record has exactly these two fields is unwrapped: Connect's converter
    wraps every message of a topic or none, and a batch is one topic-partition.
    """
    if set(decoded.records.column_names) != {"schema", "payload"}:
        return decoded
    if decoded.routed is not None:  # only the routing fields were parsed: parse every field now
        full = decoded.subset(np.arange(len(decoded.rows)))
        decoded = Decoded(
            full.records, decoded.rows[full.rows], decoded.failures, lossy=full.lossy, _python=full.python
        )
    annotations = _annotations(decoded)
    payload = decoded.records.column("payload").combine_chunks()
    if "payload" in decoded.lossy or not pa.types.is_struct(payload.type):
        # The events' fields differ in type: from the records as Python objects, as the decoder would.
        objects = [p if isinstance(p, dict) else {} for p in (r.get("payload") for r in decoded.python())]
        records, lossy = arrow_from_python(objects)
        return Decoded(
            _annotate(records, annotations),
            decoded.rows,
            decoded.failures,
            lossy=lossy,
            _python_cache=objects,
        )
    fields = list(payload.type)
    arrays = [payload.field(i) for i in range(len(fields))]
    if payload.null_count:
        arrays = [pc.if_else(payload.is_valid(), a, pa.nulls(len(a), a.type)) for a in arrays]
    records = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    return Decoded(_annotate(records, annotations), decoded.rows, decoded.failures)


def _annotations(decoded: Decoded) -> dict[str, dict[bytes, bytes]]:
    """Per row column, the Connect logical type the wrapper's schema names (and a decimal's scale).

    A column annotated differently by different events of the batch (the source table's schema
    changed within it) gets no annotation: its values are then converted to the table's column
    type like any other record's, rather than read with a type that fits only some of them.
    """
    found: dict[str, set[tuple[tuple[bytes, bytes], ...]]] = {}
    for field, name, scale, precision in _schema_columns(decoded):
        if name is None:  # a plain column here; if annotated elsewhere in the batch, they disagree
            found.setdefault(field, set()).add(())
            continue
        entry = {CONNECT_NAME: name.encode()}
        if scale is not None:
            entry[CONNECT_SCALE] = scale.encode()
        if precision is not None:
            entry[CONNECT_PRECISION] = precision.encode()
        found.setdefault(field, set()).add(tuple(sorted(entry.items())))
    result: dict[str, dict[bytes, bytes]] = {}
    for field, variants in found.items():
        if len(variants) == 1:
            if variant := next(iter(variants)):
                result[field] = dict(variant)
        else:
            log.warning(
                "Connect schemas of one batch disagree on column %s's logical type: read as sent", field
            )
    return result


_Column = tuple[str, str | None, str | None, str | None]
"""A row column's (field, logical type name or None, scale, precision) in a Connect schema."""


def _schema_columns(decoded: Decoded) -> list[_Column]:
    """The distinct columns of the row-image sections of the batch's Connect schemas.

    Whole-column when the schemas parsed as one Arrow struct (one table's events); otherwise from
    the records as Python objects.
    """
    schema = decoded.records.column("schema").combine_chunks()
    try:
        sections = pc.list_flatten(pc.struct_field(schema, "fields"))
        sections = sections.filter(pc.is_in(pc.struct_field(sections, "field"), pa.array(IMAGES)))
        columns = pc.list_flatten(pc.struct_field(sections, "fields"))
        if columns.type.get_field_index("name") < 0:
            return []
        table = pa.table(
            {
                "field": pc.struct_field(columns, "field"),
                "name": pc.struct_field(columns, "name"),
                "scale": _parameter(columns, "scale"),
                "precision": _parameter(columns, "connect.decimal.precision"),
            }
        )
        distinct = table.group_by(table.column_names).aggregate([])
        return [
            (r["field"], r["name"], r["scale"], r["precision"])
            for r in distinct.to_pylist()
            if r["field"] is not None
        ]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError, TypeError):
        pass
    found: set[_Column] = set()
    for record in decoded.python():
        wrapper = record.get("schema")
        sections = wrapper.get("fields") if isinstance(wrapper, dict) else None
        for section in sections if isinstance(sections, list) else []:
            if not isinstance(section, dict) or section.get("field") not in IMAGES:
                continue
            for column in section.get("fields") or []:
                if isinstance(column, dict) and isinstance(column.get("field"), str):
                    parameters = column.get("parameters") or {}
                    scale, precision = parameters.get("scale"), parameters.get("connect.decimal.precision")
                    name = column.get("name")
                    found.add(
                        (
                            column["field"],
                            name if isinstance(name, str) else None,
                            None if scale is None else str(scale),
                            None if precision is None else str(precision),
                        )
                    )
    return sorted(found, key=str)


def _parameter(columns: pa.Array, name: str) -> pa.Array:
    """A Connect schema parameter of each column as text (null where absent)."""
    if columns.type.get_field_index("parameters") < 0:
        return pa.nulls(len(columns), pa.string())
    parameters = pc.struct_field(columns, "parameters")
    if not pa.types.is_struct(parameters.type) or parameters.type.get_field_index(name) < 0:
        return pa.nulls(len(columns), pa.string())
    return pc.struct_field(parameters, name).cast(pa.string())


def _annotate(records: pa.Table, annotations: dict[str, dict[bytes, bytes]]) -> pa.Table:
    """``records`` with the image structs' fields carrying their logical types as metadata."""
    if not annotations:
        return records
    fields = []
    for field in records.schema:
        if field.name in IMAGES and pa.types.is_struct(field.type):
            children = [
                child.with_metadata(annotations[child.name]) if child.name in annotations else child
                for child in field.type
            ]
            fields.append(field.with_type(pa.struct(children)))
        else:
            fields.append(field)
    return records.cast(pa.schema(fields, metadata=records.schema.metadata))


# --------------------------------------------------------------------------------------------
# Row images


@dataclass(frozen=True)
class Ops:
    """What each event of a batch is: positions (into the batch) by kind of change."""

    upserts: np.ndarray
    """``c``, ``r``, ``u``: the ``after`` image replaces the row with its key."""
    deletes: np.ndarray
    """``d``: the key of the ``before`` image is deleted."""
    truncates: np.ndarray
    """``t``: the whole table was truncated at the source."""
    bad: list[tuple[int, str]]
    """Events that are none of these, with the dead letter's reason."""


def classify(records: pa.Table, python: Callable[[], list[Any]]) -> Ops:
    """Each event's kind, from its ``op`` (whole-column when ``op`` is a string column)."""
    n = records.num_rows
    if "op" in records.column_names and pa.types.is_string(records.column("op").type):
        op = np.asarray(records.column("op").to_numpy(zero_copy_only=False), dtype=object)
    else:
        op = np.asarray([r.get("op") if isinstance(r, dict) else None for r in python()], dtype=object)
        if n == 0:
            op = np.zeros(0, dtype=object)
    upsert = np.isin(op, ["c", "r", "u"])
    delete = op == "d"
    truncate = op == "t"
    bad_positions = np.flatnonzero(~(upsert | delete | truncate))
    bad = [
        (int(p), f"not a Debezium change event: op is {op[p]!r}, not one of c, r, u, d, t")
        for p in bad_positions
    ]
    return Ops(np.flatnonzero(upsert), np.flatnonzero(delete), np.flatnonzero(truncate), bad)


def row_images(
    records: pa.Table, python: Callable[[], list[Any]], upserts: np.ndarray, deletes: np.ndarray
) -> tuple[pa.Table, np.ndarray]:
    """The row image of each upsert (``after``) and delete (``before``), logical types applied;
    returns the images and their positions in ``records`` (ascending). ``python`` gives the
    records as Python objects, for an image column that is no Arrow struct (its fields' types
    differ between events, so the decoder kept it as JSON text)."""
    parts = [
        _image(records, python, name, positions)
        for name, positions in (("after", upserts), ("before", deletes))
        if len(positions)
    ]
    positions = np.concatenate([upserts, deletes]).astype(np.int64)
    if not parts:
        return _no_columns(0), positions
    images = parts[0] if len(parts) == 1 else _concat(parts)
    order = np.argsort(positions, kind="stable")
    if images.num_columns == 0:  # no event had an image: ``take`` would drop the rows too
        return _no_columns(len(positions)), positions[order]
    return images.take(pa.array(order, pa.int64())), positions[order]


def _concat(parts: list[pa.Table]) -> pa.Table:
    """``after`` and ``before`` images as one table; when a column's type differs between them
    (a bad event's text id beside good integer ids), from Python objects as the decoder would."""
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        table, _ = arrow_from_python([row for part in parts for row in part.to_pylist()])
        return table


def _no_columns(rows: int) -> pa.Table:
    return pa.table({"_": pa.nulls(rows)}).drop_columns(["_"])


def _image(records: pa.Table, python: Callable[[], list[Any]], name: str, positions: np.ndarray) -> pa.Table:
    if name not in records.column_names:
        return _no_columns(len(positions))
    column = records.column(name).combine_chunks().take(pa.array(positions, pa.int64()))
    if pa.types.is_null(column.type):  # null in every event: no image, so no key either
        return _no_columns(len(positions))
    if not pa.types.is_struct(column.type):
        objects = python()
        images = [objects[p].get(name) for p in positions.tolist()]
        table, _ = arrow_from_python([i if isinstance(i, dict) else {} for i in images])
        return table if table.num_rows == len(positions) else _no_columns(len(positions))
    fields = list(column.type)
    arrays = [column.field(i) for i in range(len(fields))]
    if column.null_count:  # a struct's children do not carry its nulls
        arrays = [pc.if_else(column.is_valid(), a, pa.nulls(len(a), a.type)) for a in arrays]
    return apply_logical_types(pa.Table.from_arrays(arrays, schema=pa.schema(fields)))


def apply_logical_types(image: pa.Table) -> pa.Table:
    """Columns with a Connect logical type (field metadata) converted to it; a column whose values
    do not all convert is left as sent, so conversion to the table's type dead-letters just the bad
    records."""
    for index, field in enumerate(image.schema):
        metadata = field.metadata or {}
        name = metadata.get(CONNECT_NAME)
        if name is None:
            continue
        convert = _LOGICAL.get(name.decode())
        if convert is None:
            continue
        try:
            converted = convert(image.column(index).combine_chunks(), metadata)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError, TypeError):
            continue
        image = image.set_column(index, pa.field(field.name, converted.type, field.nullable), converted)
    return image


def _integers(column: pa.Array) -> pa.Array:
    if not pa.types.is_integer(column.type):
        raise TypeError(f"{column.type} is not an integer type")
    return column.cast(pa.int64())


def _date(column: pa.Array, _: dict[bytes, bytes]) -> pa.Array:
    return _integers(column).cast(pa.int32()).cast(pa.date32())


def _timestamp(unit: str) -> Callable[[pa.Array, dict[bytes, bytes]], pa.Array]:
    def convert(column: pa.Array, _: dict[bytes, bytes]) -> pa.Array:
        stamped = _integers(column).cast(pa.timestamp(unit))
        return (
            stamped.cast(pa.timestamp("us"), safe=False) if unit == "ns" else stamped.cast(pa.timestamp("us"))
        )

    return convert


def _zoned_timestamp(column: pa.Array, _: dict[bytes, bytes]) -> pa.Array:
    if not pa.types.is_string(column.type):
        raise TypeError("ZonedTimestamp is not text")
    return column.cast(pa.timestamp("us", tz="UTC"))


def _time(unit: str) -> Callable[[pa.Array, dict[bytes, bytes]], pa.Array]:
    def convert(column: pa.Array, _: dict[bytes, bytes]) -> pa.Array:
        values = _integers(column)
        timed = (
            values.cast(pa.int32()).cast(pa.time32("ms")) if unit == "ms" else values.cast(pa.time64(unit))
        )
        return timed.cast(pa.time64("us"), safe=unit != "ns")

    return convert


def _decimal(column: pa.Array, metadata: dict[bytes, bytes]) -> pa.Array:
    """Connect's Decimal: the unscaled value as big-endian two's complement bytes (base64 text in
    JSON, bytes in Avro) and the scale in the schema; read per value (no Arrow kernel for it)."""
    scale = int(metadata.get(CONNECT_SCALE, b"0"))
    precision = int(metadata.get(CONNECT_PRECISION, b"38"))
    text = pa.types.is_string(column.type)
    if not (text or pa.types.is_binary(column.type)):
        raise TypeError(f"a Decimal is bytes or base64 text, not {column.type}")
    values: list[Decimal | None] = []
    for value in column.to_pylist():
        if value is None:
            values.append(None)
            continue
        raw = base64.b64decode(value, validate=True) if text else value
        values.append(Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale))
    return pa.array(values, pa.decimal128(max(precision, scale, 1), scale))


_LOGICAL: dict[str, Callable[[pa.Array, dict[bytes, bytes]], pa.Array]] = {
    "io.debezium.time.Date": _date,
    "org.apache.kafka.connect.data.Date": _date,
    "io.debezium.time.Timestamp": _timestamp("ms"),
    "org.apache.kafka.connect.data.Timestamp": _timestamp("ms"),
    "io.debezium.time.MicroTimestamp": _timestamp("us"),
    "io.debezium.time.NanoTimestamp": _timestamp("ns"),
    "io.debezium.time.ZonedTimestamp": _zoned_timestamp,
    "io.debezium.time.Time": _time("ms"),
    "org.apache.kafka.connect.data.Time": _time("ms"),
    "io.debezium.time.MicroTime": _time("us"),
    "io.debezium.time.NanoTime": _time("ns"),
    _DECIMAL: _decimal,
}
"""Connect logical type -> conversion of its column. Iceberg keeps microseconds: nanosecond
values are truncated to them."""
