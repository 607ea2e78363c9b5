"""The schema a new table, or a new column, gets from the rows routed to that table.

Rows reach a table as columns of the whole decoded batch: when one Arrow call parsed every record
of a topic, a payment row also has the order's ``customer`` column, null. So a field that is null
in every one of the table's rows says nothing by itself; the table's own records decide:

* it is left out when the table's records do not carry it (``carried``: asked only here, when a
  schema is inferred, because it reads the records as Python objects), or when the table may add
  columns later (``skip_null_columns``: evolution adds it with its real type once a value comes);
* otherwise (the records carry it, always null, and the table cannot add it later) it is kept
  with the type the decoder gave it: the writer schema's for Avro and Protobuf, for JSON a string
  unless other records of the batch had values for it.

Inferred timestamps (:func:`timestamp_type`), a rule meant never to surprise:

* a string field becomes a timestamp when every non-null value is an ISO-8601 date-time
  (``2024-05-01T10:00:00``, optional fraction, ``T`` or a space): ``timestamptz`` when every value
  has a zone (``Z``, ``+02:00``), ``timestamp`` when none has; a mix, a bare date, or a value Arrow
  cannot parse keeps it a string;
* an integer field becomes ``timestamptz`` (epoch milliseconds) when its name says time (``ts``,
  ``time``, ``timestamp``, or ending ``_ts``, ``_at``, ``_time``, ``_timestamp``, ``_ms``;
  camelCase counts, ``createdAt``) and every non-null value lies within 2000-01-01..2100-01-01;
* a field null in every row is never a timestamp; ``conversion.infer-timestamps: false`` turns the
  rule off for a table, and a declared ``schema`` file bypasses inference altogether.

Once the table exists its column types are what they are: later rows are converted to them, and a
value that does not fit (an unparseable string in a timestamp column) is a dead letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.config.tables import TableSettings
from fanout_sink.transform.convert import to_timestamps

Carried = Callable[[tuple[str, ...]], bool]
"""Whether any of the table's records holds the field at a path (nested objects, lists of them),
even as null."""

EPOCH_MS_WINDOW = (946_684_800_000, 4_102_444_800_000)
"""Epoch milliseconds an integer time field must lie in: 2000-01-01 (inclusive) to 2100-01-01 UTC.
Epoch seconds and microseconds of this century fall outside it, so they stay integers."""

_DATE_TIME = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?\s*(Z|z|[+-]\d{2}(:?\d{2})?)?$"
_WITH_ZONE = r"\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?\s*(Z|z|[+-]\d{2}(:?\d{2})?)$"
_TIME_NAMES = {"ts", "time", "timestamp"}
_TIME_SUFFIXES = ("_ts", "_at", "_time", "_timestamp", "_ms")
_TIME_TRANSFORMS = {"year", "month", "day", "hour"}
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError)


def time_named(name: str) -> bool:
    """Whether an integer field's name says it holds a point in time (see the module's rule)."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    return snake in _TIME_NAMES or snake.endswith(_TIME_SUFFIXES)


def timestamp_type(array: pa.Array, name: str) -> pa.DataType | None:
    """The timestamp type an inferred column is offered as, or ``None`` when it stays as it is."""
    values = array.drop_null()
    if len(values) == 0:
        return None
    if _is_string(values.type):
        text = pc.utf8_trim_whitespace(values.cast(pa.string()))
        if not pc.all(pc.match_substring_regex(text, _DATE_TIME)).as_py():
            return None
        zoned = pc.sum(pc.match_substring_regex(text, _WITH_ZONE).cast(pa.int64())).as_py() or 0
        if zoned not in (0, len(text)):
            return None  # some with a zone, some without: which instant the others mean is a guess
        target = pa.timestamp("us", tz="UTC") if zoned else pa.timestamp("us")
        try:
            to_timestamps(text, target)  # the regex admits 2024-13-45 and nanoseconds Arrow refuses
        except _CAST_ERRORS:
            return None
        return target
    if pa.types.is_integer(values.type) and time_named(name):
        bounds = pc.min_max(values)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if EPOCH_MS_WINDOW[0] <= low and high < EPOCH_MS_WINDOW[1]:
            return pa.timestamp("us", tz="UTC")
    return None


def normalise_type(dtype: pa.DataType) -> pa.DataType:
    """An Arrow type PyIceberg can map to an Iceberg type (nulls become strings, and so on)."""
    if pa.types.is_null(dtype):
        return pa.string()
    if pa.types.is_dictionary(dtype):
        return normalise_type(dtype.value_type)
    if pa.types.is_timestamp(dtype):
        return pa.timestamp("us", tz="UTC" if dtype.tz is not None else None)
    if pa.types.is_unsigned_integer(dtype):
        return pa.int64() if dtype.bit_width >= 32 else pa.int32()
    if pa.types.is_integer(dtype) and dtype.bit_width < 32:
        return pa.int32()
    if pa.types.is_float16(dtype):
        return pa.float32()
    if pa.types.is_struct(dtype):
        if dtype.num_fields == 0:
            return pa.string()
        return pa.struct([normalise_field(f) for f in dtype])
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.list_(normalise_field(dtype.value_field))
    if pa.types.is_map(dtype):
        return pa.map_(normalise_type(dtype.key_type), normalise_field(dtype.item_field))
    if pa.types.is_time32(dtype):
        return pa.time64("us")
    return dtype


def normalise_field(f: pa.Field, optional: bool = False) -> pa.Field:
    return pa.field(f.name, normalise_type(f.type), nullable=True if optional else f.nullable)


@dataclass(frozen=True)
class Inference:
    """How one table's columns are inferred from its rows (see the module docstring)."""

    skip_null_columns: bool = False
    carried: Carried | None = None
    timestamps: bool = True
    keep: frozenset[str] = frozenset()
    """Top-level columns kept even when null in every row (partition source columns)."""
    time_columns: frozenset[str] = frozenset()
    """Columns a time partition transform uses: strings that parse become ``timestamptz``."""

    @classmethod
    def for_table(cls, settings: TableSettings, carried: Carried | None = None) -> Inference:
        parts = settings.partition_by
        return cls(
            skip_null_columns=settings.evolution.add_columns,
            carried=carried,
            timestamps=settings.conversion.infer_timestamps,
            keep=frozenset(p.column for p in parts),
            time_columns=frozenset(p.column for p in parts if p.transform in _TIME_TRANSFORMS),
        )

    def schema(self, rows: pa.Table) -> pa.Schema:
        """An Arrow schema for a new table from the first rows routed to it; every column optional."""
        fields = [self.column(name, rows.column(name)) for name in rows.column_names]
        return pa.schema([f for f in fields if f is not None])

    def column(self, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Field | None:
        """The optional field for a top-level column, or ``None`` when it is left out."""
        array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if name in self.keep and array.null_count == len(array):
            return pa.field(name, normalise_type(array.type))
        if name in self.time_columns and _is_string(array.type) and array.null_count < len(array):
            try:  # a time partition transform needs a timestamp: any parseable strings will do
                to_timestamps(array, pa.timestamp("us", tz="UTC"))
                return pa.field(name, pa.timestamp("us", tz="UTC"))
            except _CAST_ERRORS:
                pass
        return self._field(name, array, (name,))

    def _field(self, name: str, array: pa.Array, path: tuple[str, ...]) -> pa.Field | None:
        """``path`` names the field in the records (lists are transparent), for :attr:`carried`."""
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.null_count == len(array):
            if self.skip_null_columns or (self.carried is not None and not self.carried(path)):
                return None
            # A writer schema's type (Avro, Protobuf); JSON's null type becomes a string.
            return pa.field(name, normalise_type(array.type))
        dtype = array.type
        if pa.types.is_struct(dtype):
            valid = array.filter(array.is_valid()) if array.null_count else array
            children = [
                self._field(child.name, pc.struct_field(valid, [i]), (*path, child.name))
                for i, child in enumerate(dtype)
            ]
            kept = [f for f in children if f is not None]
            if not kept:
                return None if self.skip_null_columns else pa.field(name, pa.string())
            return pa.field(name, pa.struct(kept))
        if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
            element = self._field(dtype.value_field.name, array.flatten(), path)
            return None if element is None else pa.field(name, pa.list_(element))
        found = timestamp_type(array, name) if self.timestamps else None
        return pa.field(name, found if found is not None else normalise_type(dtype))


def _is_string(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))
