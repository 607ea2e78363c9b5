"""Conversion of routed rows to a table's Arrow schema, vectorised, with per-row failures.

For every column of the target schema the source column is found by name (exact, then the
table's ``conversion.name-mapping`` aliases, then -- with ``conversion.case-insensitive`` -- by
lower-cased name) and cast to the column's type:

* numbers from numbers or numeric strings (``"42"``, ``"4.2e1"``); narrowing must not overflow
* timestamps from ISO-8601 strings with or without zone (``2024-05-01T10:00:00+02:00``,
  ``2024-05-01 10:00:00``, ``2024-05-01``), from epoch milliseconds (numbers or digit strings)
  and from timestamps; zone-less values are taken as UTC for ``timestamptz``, zoned values are
  converted to UTC for ``timestamp``
* dates from ``YYYY-MM-DD`` strings, timestamps (the UTC date) and epoch milliseconds
* decimals from strings, numbers and decimals, rounded half-up (away from zero) to the column's
  scale; a value that does not fit the precision fails
* booleans from booleans, numbers and ``true/false/yes/no/y/n/t/f/1/0`` (any case)
* strings from anything (nested values as JSON text); binary from strings (UTF-8)
* structs field by field, lists element by element, maps from maps or from JSON objects

Missing optional columns become null. A missing or null required column, or a value that cannot
be cast, fails that row with the column named; the rest of the batch converts normally. Bad rows
are found by bisection, so a batch with one bad value costs a few extra casts, not one per row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.config.tables import ConversionSettings

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError, ValueError)

_ZONED = r"\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|z|[+-]\d{2}(:?\d{2})?)$"
_DIGITS = r"^\s*-?\d+\s*$"
_TRUE = ["true", "t", "yes", "y", "1"]
_FALSE = ["false", "f", "no", "n", "0"]


@dataclass
class Converted:
    """Converted rows (exactly ``schema``), the input positions they came from, and the failures."""

    rows: pa.Table
    positions: np.ndarray
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    """(input position, column path, reason)"""


@dataclass(frozen=True)
class Matching:
    """How target columns find their source: aliases per target name and case-insensitivity."""

    name_mapping: dict[str, list[str]] = field(default_factory=dict)
    case_insensitive: bool = False

    @classmethod
    def of(cls, settings: ConversionSettings) -> Matching:
        if settings is None:
            return cls()
        return cls(dict(settings.name_mapping), bool(settings.case_insensitive))

    def find(self, names: list[str], target: str, path: str) -> str | None:
        if target in names:
            return target
        for alias in self.name_mapping.get(path, []) + (
            self.name_mapping.get(target, []) if path != target else []
        ):
            if alias in names:
                return alias
        if self.case_insensitive:
            lowered = target.lower()
            for name in names:
                if name.lower() == lowered:
                    return name
        return None


class _Bad:
    """Failed rows of one conversion: position -> (column path, reason). The first failure wins."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, str]] = {}

    def add(self, position: int, column: str, reason: str) -> None:
        self.rows.setdefault(position, (column, reason))

    def mask(self, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        if self.rows:
            mask[list(self.rows)] = True
        return mask


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(dtype: pa.DataType) -> str:
    return str(dtype).replace("large_", "")


# --------------------------------------------------------------------------------------------
# Primitive casts (each raises on any bad value; bisection isolates which)


def _is_string(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))


def _is_nested(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_struct(dtype)
        or pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_map(dtype)
    )


def _where(mask: pa.Array, array: pa.Array) -> pa.Array:
    return pc.if_else(mask, array, pa.nulls(len(array), array.type))


def to_timestamps(array: pa.Array, target: pa.DataType) -> pa.Array:
    naive = pa.timestamp("us")
    aware = pa.timestamp("us", tz="UTC")
    tz_target = target.tz is not None
    src = array.type
    if _is_string(src):
        text = pc.utf8_trim_whitespace(array.cast(pa.string()))
        zoned = pc.match_substring_regex(text, _ZONED).fill_null(False)
        digits = pc.match_substring_regex(text, _DIGITS).fill_null(False)
        plain = pc.and_(pc.invert(zoned), pc.invert(digits))
        text = pc.replace_substring_regex(text, r"(\d{2}:\d{2}(:\d{2}(\.\d+)?)?)\s*[zZ]$", r"\1+00:00")
        text = pc.replace_substring_regex(text, r"(\d)\s+([+-]\d{2}(:?\d{2})?)$", r"\1\2")
        parts = [
            pc.cast(pc.cast(_where(zoned, text), aware), naive if not tz_target else aware),
            pc.cast(_where(plain, text), naive).cast(aware if tz_target else naive),
            pc.cast(
                pc.cast(_where(digits, text), pa.int64()), pa.timestamp("ms", tz="UTC" if tz_target else None)
            ),
        ]
        result = pc.coalesce(*[p.cast(target) for p in parts])
        return result
    if pa.types.is_integer(src):
        return pc.cast(pc.cast(array, pa.int64()), pa.timestamp("ms", tz="UTC" if tz_target else None)).cast(
            target
        )
    if pa.types.is_floating(src):
        return to_timestamps(pc.cast(array, pa.int64()), target)
    if pa.types.is_timestamp(src):
        if src.tz is not None and not tz_target:
            array = pc.cast(array, pa.timestamp(src.unit, tz="UTC")).cast(pa.timestamp(src.unit))
        elif src.tz is None and tz_target:
            array = pc.cast(array, pa.timestamp(src.unit, tz="UTC"))
        return pc.cast(array, target)
    if pa.types.is_date(src):
        return pc.cast(pc.cast(array, pa.timestamp("us")), target)
    raise pa.ArrowNotImplementedError(f"cannot convert {_type_name(src)} to {_type_name(target)}")


def _dates(array: pa.Array, target: pa.DataType) -> pa.Array:
    src = array.type
    if _is_string(src):
        text = pc.utf8_trim_whitespace(array.cast(pa.string()))
        short = pc.equal(pc.utf8_length(text), 10).fill_null(False)
        as_dates = pc.cast(_where(short, text), target)
        rest = _where(pc.invert(short), text)
        as_ts = pc.cast(to_timestamps(rest, pa.timestamp("us")), target, safe=False)
        return pc.coalesce(as_dates, as_ts)
    if pa.types.is_timestamp(src) or pa.types.is_integer(src):
        return pc.cast(to_timestamps(array, pa.timestamp("us")), target, safe=False)
    return pc.cast(array, target)


def _decimals(array: pa.Array, target: pa.DataType) -> pa.Array:
    src = array.type
    if pa.types.is_floating(src):
        array = pc.cast(array, pa.string())
        src = array.type
    if _is_string(src):
        array = pc.cast(pc.utf8_trim_whitespace(array.cast(pa.string())), pa.decimal128(38, 18))
    elif pa.types.is_integer(src):
        array = pc.cast(pc.cast(array, pa.int64()), pa.decimal128(38, 18))
    elif not pa.types.is_decimal(src):
        raise pa.ArrowNotImplementedError(f"cannot convert {_type_name(src)} to {_type_name(target)}")
    rounded = pc.round(array, ndigits=target.scale, round_mode="half_towards_infinity")
    return pc.cast(rounded, target)


def _booleans(array: pa.Array, target: pa.DataType) -> pa.Array:
    src = array.type
    if _is_string(src):
        text = pc.utf8_lower(pc.utf8_trim_whitespace(array.cast(pa.string())))
        yes = pc.is_in(text, value_set=pa.array(_TRUE))
        no = pc.is_in(text, value_set=pa.array(_FALSE))
        if pc.any(pc.and_(text.is_valid(), pc.invert(pc.or_(yes, no)))).as_py():
            raise pa.ArrowInvalid("not a boolean")
        return pc.if_else(yes, True, pc.if_else(no, False, pa.nulls(len(text), pa.bool_())))
    return pc.cast(array, target)


def _integers(array: pa.Array, target: pa.DataType) -> pa.Array:
    if _is_string(array.type):
        text = pc.utf8_trim_whitespace(array.cast(pa.string()))
        try:
            return pc.cast(text, target)
        except pa.ArrowInvalid:
            return pc.cast(pc.cast(text, pa.float64()), target)
    if pa.types.is_boolean(array.type):
        return pc.cast(array, target)
    return pc.cast(array, target)


def _floats(array: pa.Array, target: pa.DataType) -> pa.Array:
    if _is_string(array.type):
        return pc.cast(pc.utf8_trim_whitespace(array.cast(pa.string())), target)
    return pc.cast(array, target)


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {str(k): _to_json(v) for k, v in value}
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def _strings(array: pa.Array, target: pa.DataType) -> pa.Array:
    src = array.type
    if _is_nested(src):
        values = [None if v is None else json.dumps(_to_json(v)) for v in array.to_pylist()]
        return pa.array(values, target)
    if pa.types.is_binary(src) or pa.types.is_large_binary(src):
        return pc.cast(array, target)
    if pa.types.is_boolean(src):
        return pc.if_else(array, "true", "false").cast(target)
    return pc.cast(array, target)


def _primitive(target: pa.DataType) -> Callable[[pa.Array, pa.DataType], pa.Array]:
    if pa.types.is_timestamp(target):
        return to_timestamps
    if pa.types.is_date(target):
        return _dates
    if pa.types.is_decimal(target):
        return _decimals
    if pa.types.is_boolean(target):
        return _booleans
    if pa.types.is_integer(target):
        return _integers
    if pa.types.is_floating(target):
        return _floats
    if _is_string(target):
        return _strings
    return lambda array, dtype: pc.cast(array, dtype)


def _isolate(
    fn: Callable[[pa.Array, pa.DataType], pa.Array], array: pa.Array, target: pa.DataType
) -> tuple[pa.Array, list[int]]:
    """Apply ``fn``; if it fails, bisect to find the failing positions and null them out."""
    try:
        return fn(array, target), []
    except _ARROW_ERRORS:
        pass
    if len(array) == 1:
        return pa.nulls(1, target), [0]
    half = len(array) // 2
    left, bad_left = _isolate(fn, array.slice(0, half), target)
    right, bad_right = _isolate(fn, array.slice(half), target)
    return pa.concat_arrays([left, right]), bad_left + [half + i for i in bad_right]


# --------------------------------------------------------------------------------------------
# Nested conversion


def _offsets(array: pa.Array) -> np.ndarray:
    offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets


def _convert(
    array: pa.Array, target: pa.Field, path: str, positions: np.ndarray, bad: _Bad, matching: Matching
) -> pa.Array:
    """``array`` converted to ``target.type``; failed rows (by ``positions``) are recorded in ``bad``."""
    dtype = target.type
    src = array.type
    n = len(array)
    if pa.types.is_dictionary(src):
        array = array.dictionary_decode()
        src = array.type
    if pa.types.is_null(src):
        return pa.nulls(n, dtype)
    if src == dtype and not _is_nested(dtype):
        return array  # the usual column: the types below are looked at only when it is not
    if _is_string(src) and _is_nested(dtype):
        parsed = _parse_json_text(array, dtype, path, positions, bad)
        if parsed is not None:
            array, src = parsed, parsed.type
            if pa.types.is_null(src):
                return pa.nulls(n, dtype)
    if pa.types.is_struct(dtype):
        if not pa.types.is_struct(src):
            return _fail_all(array, dtype, path, positions, bad)
        names = [src.field(i).name for i in range(src.num_fields)]
        valid = array.is_valid()
        children = []
        for child in dtype:
            child_path = f"{path}.{child.name}"
            source = matching.find(names, child.name, child_path)
            if source is None:
                values = pa.nulls(n, child.type)
            else:
                values = pc.struct_field(array, source)
                if array.null_count:
                    values = _where(valid, values)
                values = _convert(values, child, child_path, positions, bad, matching)
            if not child.nullable:
                _require(values, child_path, positions, bad, parent_valid=valid)
                if values.null_count:
                    values = pc.coalesce(values, _zero(child.type, n))
            children.append(values)
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(dtype), mask=mask)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        if not (pa.types.is_list(src) or pa.types.is_large_list(src)):
            return _fail_all(array, dtype, path, positions, bad)
        offsets = _offsets(array)
        values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        offsets = offsets - offsets[0]
        parents = np.repeat(positions, np.diff(offsets))
        element = dtype.value_field
        converted = _convert(values, element, f"{path}[]", parents, bad, matching)
        if not element.nullable:
            _require(converted, f"{path}[]", parents, bad)
        offset_type = pa.int64() if pa.types.is_large_list(dtype) else pa.int32()
        mask = array.is_null() if array.null_count else None
        cls = pa.LargeListArray if pa.types.is_large_list(dtype) else pa.ListArray
        return cls.from_arrays(pa.array(offsets, offset_type), converted, type=dtype, mask=mask)
    if pa.types.is_map(dtype):
        return _convert_map(array, dtype, path, positions, bad, matching)
    fn = _primitive(dtype)
    nested_source = _is_nested(src)
    if nested_source and not _is_string(dtype):
        return _fail_all(array, dtype, path, positions, bad)
    if src == dtype:
        return array
    result, failed = _isolate(fn, array, dtype)
    for index in failed:
        value = array[index].as_py()
        bad.add(
            int(positions[index]),
            path,
            f"column {path!r}: cannot convert {_show(value)} ({_type_name(src)}) to {_type_name(dtype)}; "
            "send a value of the column's type, or map another field to it with select",
        )
    return result


def _parse_json_text(
    array: pa.Array, dtype: pa.DataType, path: str, positions: np.ndarray, bad: _Bad
) -> pa.Array | None:
    """JSON text (a field whose type changed within a batch is kept as text) -> nested Arrow values.

    Per value, in Python: this only runs for columns that could not be decoded as one type.
    """
    values: list[Any] = []
    for index, text in enumerate(array.to_pylist()):
        if text is None:
            values.append(None)
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = None
            bad.add(int(positions[index]), path, f"column {path!r}: {_show(text)} is not a JSON value")
        if pa.types.is_struct(dtype) or pa.types.is_map(dtype):
            if value is not None and not isinstance(value, dict):
                bad.add(int(positions[index]), path, f"column {path!r}: {_show(text)} is not a JSON object")
                value = None
            if pa.types.is_map(dtype) and isinstance(value, dict):
                value = list(value.items())
        elif value is not None and not isinstance(value, list):
            bad.add(int(positions[index]), path, f"column {path!r}: {_show(text)} is not a JSON array")
            value = None
        values.append(value)
    try:
        return pa.array(values) if not pa.types.is_map(dtype) else pa.array(values, dtype)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None


def _convert_map(
    array: pa.Array, dtype: pa.MapType, path: str, positions: np.ndarray, bad: _Bad, matching: Matching
) -> pa.Array:
    n = len(array)
    src = array.type
    key_field, item_field = dtype.key_field, dtype.item_field
    if pa.types.is_map(src):
        offsets = _offsets(array)
        start, end = int(offsets[0]), int(offsets[-1])
        keys = array.keys.slice(start, end - start)
        items = array.items.slice(start, end - start)
        offsets = offsets - offsets[0]
    elif pa.types.is_struct(src):
        m = src.num_fields
        names = [src.field(i).name for i in range(m)]
        if m == 0:
            offsets = np.zeros(n + 1, dtype=np.int64)
            keys = pa.array([], pa.string())
            items = pa.nulls(0)
        else:
            columns = [pc.struct_field(array, name) for name in names]
            valid_matrix = np.stack(
                [np.asarray(c.is_valid().to_numpy(zero_copy_only=False), dtype=bool) for c in columns], axis=1
            )
            parent_valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            valid_matrix &= parent_valid[:, None]
            counts = valid_matrix.sum(axis=1)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            flat = np.flatnonzero(valid_matrix.reshape(-1))
            rows, cols = np.divmod(flat, m)
            keys = pa.array([names[c] for c in cols.tolist()], pa.string())
            # Interleave children: convert each child on its own, then gather.
            converted = [
                _convert(c, item_field, f"{path}.{name}", positions, bad, matching)
                for c, name in zip(columns, names, strict=True)
            ]
            stacked = pa.concat_arrays(converted)
            items = stacked.take(pa.array(cols * n + rows, pa.int64()))
            keys = keys.cast(key_field.type)
            mask = array.is_null() if array.null_count else None
            return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items, type=dtype, mask=mask)
    else:
        return _fail_all(array, dtype, path, positions, bad)
    parents = np.repeat(positions, np.diff(offsets))
    keys = _convert(keys, key_field, f"{path}.key", parents, bad, matching)
    items = _convert(items, item_field, f"{path}.value", parents, bad, matching)
    if not item_field.nullable:
        _require(items, f"{path}.value", parents, bad)
    mask = array.is_null() if array.null_count else None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items, type=dtype, mask=mask)


def _fail_all(array: pa.Array, dtype: pa.DataType, path: str, positions: np.ndarray, bad: _Bad) -> pa.Array:
    valid = np.flatnonzero(np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    for index in valid.tolist():
        bad.add(
            int(positions[index]),
            path,
            f"column {path!r}: cannot convert {_type_name(array.type)} value {_show(array[index].as_py())} "
            f"to {_type_name(dtype)}",
        )
    return pa.nulls(len(array), dtype)


def _require(
    values: pa.Array, path: str, positions: np.ndarray, bad: _Bad, parent_valid: pa.Array | None = None
) -> None:
    if not values.null_count:
        return
    missing = values.is_null()
    if parent_valid is not None:
        missing = pc.and_(missing, parent_valid)
    for index in np.flatnonzero(np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool)).tolist():
        bad.add(
            int(positions[index]),
            path,
            f"required column {path!r} is missing or null; send it, map it with conversion.name-mapping, "
            "or make the column optional",
        )


def _zero(dtype: pa.DataType, n: int) -> pa.Array:
    """Placeholder values for required slots of rows that are dropped anyway (keeps arrays valid)."""
    if pa.types.is_struct(dtype):
        return pa.StructArray.from_arrays([_zero(f.type, n) for f in dtype], fields=list(dtype))
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_map(dtype):
        return pa.array([[]] * n, dtype)
    if pa.types.is_fixed_size_binary(dtype):
        return pa.array([b"\0" * dtype.byte_width] * n, dtype)
    if isinstance(dtype, pa.ExtensionType):
        return pa.ExtensionArray.from_storage(dtype, _zero(dtype.storage_type, n))
    if _is_string(dtype):
        return pa.array([""] * n, dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.array([b""] * n, dtype)
    if pa.types.is_boolean(dtype):
        return pa.array(np.zeros(n, dtype=bool))
    if pa.types.is_decimal(dtype):
        return pa.array([Decimal(0)] * n, dtype)
    if pa.types.is_date32(dtype) or pa.types.is_time32(dtype):
        return pa.array(np.zeros(n, dtype=np.int32)).cast(dtype)
    if pa.types.is_temporal(dtype):
        return pa.array(np.zeros(n, dtype=np.int64)).cast(dtype)
    return pc.cast(pa.array(np.zeros(n, dtype=np.int8)), dtype)


def convert(rows: pa.Table, schema: pa.Schema, matching: Matching | None = None) -> Converted:
    """Convert ``rows`` to ``schema``; rows that fail are left out and reported with their column."""
    matching = matching or Matching()
    n = rows.num_rows
    positions = np.arange(n, dtype=np.int64)
    bad = _Bad()
    names = rows.column_names
    arrays = []
    for target in schema:
        source = matching.find(names, target.name, target.name)
        if source is None:
            values = pa.nulls(n, target.type)
        else:
            values = _convert(
                rows.column(source).combine_chunks(), target, target.name, positions, bad, matching
            )
        if not target.nullable:
            _require(values, target.name, positions, bad)
            if values.null_count:
                values = pc.coalesce(values, _zero(target.type, n))
        arrays.append(values)
    table = pa.Table.from_arrays(arrays, schema=schema)
    if bad.rows:
        keep = ~bad.mask(n)
        table = table.filter(pa.array(keep))
        positions = positions[keep]
    failures = sorted((pos, column, reason) for pos, (column, reason) in bad.rows.items())
    return Converted(table, positions, failures)


# --------------------------------------------------------------------------------------------
# Types rather than values (``fanout-sink validate``)


def _placeholder(dtype: pa.DataType) -> pa.Array:
    """One value standing for every value of ``dtype``: text is null (the converter parses text into
    every type, so only real text can fail), a list holds one element, the rest are zero or empty."""
    if _is_string(dtype) or pa.types.is_null(dtype) or pa.types.is_dictionary(dtype):
        return pa.nulls(1, dtype)
    if pa.types.is_struct(dtype):
        return pa.StructArray.from_arrays([_placeholder(f.type) for f in dtype], fields=list(dtype))
    if pa.types.is_list(dtype):
        return pa.ListArray.from_arrays(
            pa.array([0, 1], pa.int32()), _placeholder(dtype.value_type), type=dtype
        )
    return _zero(dtype, 1)


def placeholder_rows(schema: pa.Schema) -> pa.Table:
    """One row standing for any record of ``schema``: what a projection or :func:`convert` makes of
    it depends on the types only, so a check can ask them about a route before any record exists."""
    return pa.Table.from_arrays([_placeholder(f.type) for f in schema], schema=schema)


def _optional(dtype: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(dtype):
        return pa.struct([pa.field(f.name, _optional(f.type)) for f in dtype])
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.list_(pa.field(dtype.value_field.name, _optional(dtype.value_type)))
    if pa.types.is_map(dtype):
        return pa.map_(dtype.key_type, pa.field(dtype.item_field.name, _optional(dtype.item_type)))
    return dtype


def type_mismatches(rows: pa.Table, schema: pa.Schema, matching: Matching | None = None) -> list[str]:
    """Paths of ``schema``'s columns that no value of their source column's type in ``rows``
    (:func:`placeholder_rows`) can become: :func:`convert` itself is asked, with every column made
    optional so that a missing value is not a failure here. Column by column: a row keeps only its
    first failure."""
    found: list[str] = []
    for target in schema:
        relaxed = pa.schema([pa.field(target.name, _optional(target.type))])
        found += [column for _, column, _ in convert(rows, relaxed, matching).failures]
    return found
