"""Kafka value bytes -> Arrow, a whole batch at a time.

Five formats (``source.format``):

* ``json``: one JSON object per value. The batch is newline-joined in Arrow and parsed by
  ``pyarrow.json.read_json`` in one call. Strings stay strings (Arrow's timestamp inference is
  undone: conversion parses timestamps per the table's column type). Whole-batch kernels screen
  the values first, so the few bad ones are dead-lettered without parsing the rest one by one.
  When a field carries different JSON types for different record kinds (string amounts on
  orders, numbers on payments), the batch is no single Arrow table: then only the fields routing
  reads are parsed in one call (the others are ignored), and after routing each table's records
  are parsed in one call (:meth:`Decoded.subset`); a bad value that the screening missed is found
  by halving. Only what that cannot handle (a routing field that itself changes type, many bad
  values) is parsed value by value with :func:`json.loads`.
  A value must be UTF-8 (not guessed: ``json.loads`` of bytes would read UTF-16 or UTF-32), hold no
  ``NaN``/``Infinity`` (not JSON; Arrow's parser accepts them) nor unpaired surrogate escapes, and be
  at most :data:`MAX_NESTING` levels deep: Arrow's parser overflows the C stack (a segfault) at about
  20 000 levels and Python's recursion limit is near 1 000, so depth is measured before parsing.
  Only values that start as an object and hold no raw line break inside a string reach Arrow's
  parser (a top-level ``null`` first in its input segfaults it; the newline join would turn the
  line break into a space). Neither do integers beyond int64: Arrow would make their whole column
  double and round every large id in the batch; they are built from exact Python ints instead.
* ``avro``: schemaless Avro with the writer schema from an ``.avsc`` file (``source.schema``).
* ``confluent-avro``: Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro
  body); schemas are fetched once per id with confluent-kafka's ``SchemaRegistryClient``.
* ``confluent-protobuf`` and ``confluent-json-schema``: the registry's Protobuf and JSON Schema
  wire formats, read by confluent-kafka's deserializers (:mod:`~fanout_sink.transform.registry_formats`)
  with the writer schema and its references.

Every decoder returns a :class:`Decoded`: the records as an Arrow table, the index of each
record's row in the input, and the failures (input index, reason) that become dead letters.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from fanout_sink.avro_schema import avro_to_arrow_schema, avro_to_arrow_type, load_avro_schema
from fanout_sink.config import SinkConfig
from fanout_sink.errors import ConfigError, SchemaError

FieldPaths = frozenset[tuple[str, ...]]
"""Record field paths (``("customer", "tier")`` for ``customer.tier``) that routing reads."""


@dataclass
class Decoded:
    """Decoded records of one batch of values.

    ``records`` has one row per decoded value, ``rows[i]`` is the input index of ``records`` row
    ``i``; ``failures`` lists ``(input index, reason)`` of values that could not be decoded.
    ``lossy`` names top-level columns whose Arrow type does not reflect every record (JSON fields
    that change type within a batch are kept as JSON text); routing evaluates predicates on those
    per record. ``python()`` returns the records as Python objects (computed once, on demand).

    ``routed`` is set when ``records`` holds only those top-level fields (the ones routing reads):
    the batch's fields disagree on types, so each table's records are parsed on their own by
    :meth:`subset` (one table's records usually agree). ``None``: ``records`` holds every field.
    """

    records: pa.Table
    rows: np.ndarray
    failures: list[tuple[int, str]] = field(default_factory=list)
    lossy: frozenset[str] = frozenset()
    routed: frozenset[str] | None = None
    _python: Callable[[], list[Any]] | None = None
    _python_cache: list[Any] | None = None
    _parse: Callable[[np.ndarray, str | None], Decoded] | None = None

    def with_rows(self, rows: np.ndarray) -> Decoded:
        """The same records with other row indices and no failures (after re-indexing)."""
        return replace(self, rows=rows, failures=[])

    def python(self) -> list[Any]:
        if self._python_cache is None:
            self._python_cache = self._python() if self._python is not None else self.records.to_pylist()
        return self._python_cache

    def carries(self, path: tuple[str, ...]) -> bool:
        """Whether any record holds the field at ``path`` (through nested objects and lists of
        them), even as null. ``records`` cannot tell: a batch parsed in one call gives every record
        every field of the batch. Reads the records as Python objects, so it is asked only when a
        table's schema is inferred (:mod:`fanout_sink.transform.inference`)."""
        return any(_holds(record, path) for record in self.python())

    def subset(self, positions: np.ndarray, key: str | None = None) -> Decoded:
        """The records at ``positions`` with every field; its ``rows`` and ``failures`` index this
        Decoded's records (a record fails here only if parsing it with its group found what the
        batch did not). ``key`` names the group (its table), so the decoder can remember its schema.

        Lossy columns are rebuilt from just those records' values: a field whose type differs
        between records bound for different tables (a bad record's string ``id`` next to good
        integer ids) then keeps its real type in each table; without this, a dynamically created
        table took the JSON text type from its bad neighbours.
        """
        if self._parse is not None:
            return self._parse(positions, key)
        rows = self.records.take(pa.array(positions, pa.int64()))
        lossy: frozenset[str] = frozenset()
        names = [name for name in rows.column_names if name in self.lossy]
        if names:
            objects = self.python()
            rebuilt, lossy = arrow_from_python(
                [{name: objects[p].get(name) for name in names} for p in positions.tolist()]
            )
            for name in names:
                rows = rows.set_column(rows.column_names.index(name), name, rebuilt.column(name))
        chosen = positions.tolist()
        return Decoded(rows, positions, lossy=lossy, _python=lambda: [self.python()[p] for p in chosen])


def _holds(value: Any, path: tuple[str, ...]) -> bool:
    if not path:
        return True
    if isinstance(value, list):
        return any(_holds(item, path) for item in value)
    return isinstance(value, dict) and path[0] in value and _holds(value[path[0]], path[1:])


class Decoder(Protocol):
    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """Decode ``values``; ``fields`` (the paths routing reads, ``None``: unknown) lets a decoder
        return only those when the whole records do not decode together (:attr:`Decoded.routed`)."""
        ...


def _empty() -> Decoded:
    return Decoded(pa.table({}), np.zeros(0, dtype=np.int64))


# --------------------------------------------------------------------------------------------
# JSON

MAX_NESTING = 64
"""Deepest JSON nesting (objects and arrays) a value may have; deeper values are dead-lettered."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BIG_INT = r"(?:^|[\[:,])\s*-?\d{19,}\s*(?:[\]},]|$)"
"""An integer token of 19 or more digits: it may not fit int64 (a cheap, conservative test)."""
_BIG_INT_TOKEN = re.compile(_BIG_INT.encode())
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")


def _nesting(value: bytes) -> int:
    """How deep objects and arrays nest in ``value`` (brackets inside strings do not count)."""
    brackets = np.frombuffer(_STRING.sub(b"", value), dtype=np.uint8)
    steps = np.zeros(len(brackets), dtype=np.int64)
    steps[(brackets == ord("[")) | (brackets == ord("{"))] = 1
    steps[(brackets == ord("]")) | (brackets == ord("}"))] = -1
    return int(np.cumsum(steps).max(initial=0))


def _value_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The bytes behind a binary or string array and the ``len + 1`` bounds of its values (no copy)."""
    wide = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    offsets, data = values.buffers()[1:3]
    if offsets is None:  # an empty array
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return raw, bounds[values.offset : values.offset + len(values) + 1]


def _may_nest_too_deep(values: pa.Array) -> np.ndarray:
    """Indices of values with more opening brackets than :data:`MAX_NESTING` (depth then decides).

    Counted in numpy over the array's one data buffer: a quarter of the time of Arrow's substring
    counting kernels, which matters because every batch is screened.
    """
    data, bounds = _value_bytes(values)
    opening = np.flatnonzero((data == ord("[")) | (data == ord("{")))
    return np.flatnonzero(np.diff(np.searchsorted(opening, bounds)) > MAX_NESTING)


def _not_an_object_first(values: pa.Array) -> np.ndarray:
    """Indices of values that do not start with ``{`` (whitespace first is rare: then they are
    merely parsed on their own)."""
    data, bounds = _value_bytes(values)
    starts = bounds[:-1]
    empty = starts >= bounds[1:]
    first = data[np.minimum(starts, len(data) - 1)] if len(data) else np.zeros(len(starts), dtype=np.uint8)
    return np.flatnonzero(empty | (first != ord("{")))


def _not_utf8(values: pa.Array, start: int = 0) -> list[int]:
    """Indices of values that are not UTF-8: one cast checks the batch, halves find the culprits."""
    try:
        values.cast(pa.string())
    except pa.ArrowInvalid:
        if len(values) == 1:
            return [start]
        half = len(values) // 2
        return _not_utf8(values[:half], start) + _not_utf8(values[half:], start + half)
    return []


class _NotForArrow(Exception):
    """A valid value Arrow's parser cannot take (an int beyond int64): parse the batch per record."""


def _screen(values: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Which values Arrow's parser may see: (their indices, failures of the others).

    Whole-batch kernels pick the few suspects, and only those are looked at one by one. Null, not
    UTF-8, not starting with ``{`` (a ``null`` first in the buffer segfaults the parser), ``NaN``
    or ``Infinity`` (Arrow's parser takes them): parsed on their own, which gives a failure's
    reason or shows a false alarm (``"NaN"`` in a string). A big int, a line break (inside a string
    it is invalid JSON the newline join would hide), too many brackets: :func:`_unsafe` decides,
    so pretty-printed values are not parsed one by one. A valid value Arrow cannot take raises
    :class:`_NotForArrow`: Arrow would make an int beyond int64's whole column double.
    """
    odd = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    odd[_not_utf8(values)] = True
    texts = np.flatnonzero(~odd)
    checked = values if len(texts) == len(values) else values.take(pa.array(texts, pa.int64()))
    odd[texts[_not_an_object_first(checked)]] = True
    risky = np.zeros(len(values), dtype=bool)  # one regex pass: each kernel costs a full scan
    flagged = pc.match_substring_regex(checked, _BIG_INT + r"|[\r\n]|NaN|Infinity")
    risky[texts[np.asarray(flagged, dtype=bool)]] = True
    risky[texts[_may_nest_too_deep(checked)]] = True
    failures: list[tuple[int, str]] = []
    for index in np.flatnonzero(odd | risky).tolist():
        value = values[index].as_py()
        unsafe = risky[index] and _unsafe(value)
        if not odd[index] and not unsafe and b"NaN" not in value and b"Infinity" not in value:
            continue
        obj, reason = parse_json_value(value)
        if obj is None:
            failures.append((index, reason or "not a JSON object"))
        elif unsafe:
            raise _NotForArrow(index)
    ok = np.arange(len(values), dtype=np.int64)
    return (np.setdiff1d(ok, [i for i, _ in failures]) if failures else ok), failures


def _unsafe(value: bytes) -> bool:
    return (
        _BIG_INT_TOKEN.search(value) is not None
        or _line_break_in_string(value)
        or _nesting(value) > MAX_NESTING
    )


def _line_break_in_string(value: bytes) -> bool:
    """A raw line break inside a string (invalid JSON) would be made a space by the newline join."""
    return any(b"\n" in text or b"\r" in text for text in _STRING.findall(value))


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""One decoder for every value (``json.loads`` with options builds a new one per call)."""


def parse_json_value(value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """One Kafka value -> ``(object, None)``, or ``(None, reason)`` when it is not a JSON object."""
    if value is None:
        return None, "value is null"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (
            f"value is not UTF-8: byte 0x{value[exc.start]:02x} at offset {exc.start} ({exc.reason}); "
            "producers must send JSON encoded as UTF-8"
        )
    if value.count(b"[") + value.count(b"{") > MAX_NESTING:
        depth = _nesting(value)
        if depth > MAX_NESTING:
            return None, f"value nests {depth} levels deep; the limit is {MAX_NESTING}"
    try:
        obj = _DECODER.decode(text)
    except ValueError as exc:
        return None, f"invalid JSON: {exc}; producers must send one JSON object per message"
    if not isinstance(obj, dict):
        return None, f"value is a JSON {_JSON_KINDS.get(type(obj), 'value')}, not an object"
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            return None, (
                f"value holds an unpaired surrogate escape (\\u{ord(exc.object[exc.start]):04x}), "
                "which is no Unicode character; producers must send valid Unicode"
            )
    return obj, None


def _without_timestamps(dtype: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(dtype):
        return pa.string()
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(_without_timestamps(f.type)) for f in dtype])
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.list_(dtype.value_field.with_type(_without_timestamps(dtype.value_type)))
    return dtype


def _newline_joined(values: pa.Array) -> pa.Buffer:
    """The values as one newline-delimited buffer; line breaks inside values become spaces.

    A line break can only sit between tokens of valid JSON, so replacing it keeps the value's
    meaning and keeps one value per line. Values rarely hold one: numpy looks first, which costs a
    tenth of the replacing.
    """
    data, bounds = _value_bytes(values)
    region = data[bounds[0] : bounds[-1]]
    values = values.cast(pa.large_binary())
    if (region == ord("\n")).any() or (region == ord("\r")).any():
        values = pc.replace_substring(values, b"\n", b" ")
        values = pc.replace_substring(values, b"\r", b" ")
    joined = pc.binary_join_element_wise(
        values, pa.scalar(b"", pa.large_binary()), pa.scalar(b"\n", pa.large_binary())
    )
    if joined.null_count:
        joined = joined.fill_null(b"\n")
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64)[
        joined.offset : joined.offset + len(joined) + 1
    ]
    data = joined.buffers()[2]
    start, end = int(offsets[0]), int(offsets[-1])
    return data.slice(start, end - start)


def _read_json(buffer: pa.Buffer, known: pa.Schema | None = None) -> pa.Table:
    """Newline-delimited JSON objects -> Arrow, strings kept as strings.

    With ``known`` (the schema of an earlier batch) one parse usually suffices; columns of the
    known schema that are entirely null in this batch are dropped again, so one batch's fields do
    not leak into another's.
    """
    if known is not None:
        try:
            options = pa_json.ParseOptions(explicit_schema=known, unexpected_field_behavior="infer")
            table = _arrow_read(buffer, options)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        else:
            if not any(_has_timestamp(f.type) for f in table.schema):
                empty = [
                    name
                    for name in known.names
                    if name in table.column_names and table.column(name).null_count == table.num_rows
                ]
                return table.drop_columns(empty) if empty else table
    table = _arrow_read(buffer)
    schema = pa.schema([f.with_type(_without_timestamps(f.type)) for f in table.schema])
    if schema.equals(table.schema):
        return table
    return _arrow_read(buffer, pa_json.ParseOptions(explicit_schema=schema))


def _arrow_read(buffer: pa.Buffer, options: pa_json.ParseOptions | None = None) -> pa.Table:
    """Arrow's JSON reader, refusing what it builds wrong: a list with a null before its other
    elements (``[null, false]``, ``[null, null]``) becomes an invalid array whose offsets pass the
    end of its values, which crashes whatever reads it next. Validating costs microseconds."""
    table = pa_json.read_json(pa.BufferReader(buffer), parse_options=options)
    table.validate()  # raises ArrowInvalid; the caller parses the values another way
    return table


def _has_timestamp(dtype: pa.DataType) -> bool:
    return not _without_timestamps(dtype).equals(dtype)


def _has_non_finite(data: pa.Table | pa.Array) -> bool:
    """Whether any float (at any depth) is NaN or infinite: Arrow's parser took a ``NaN`` literal."""
    if isinstance(data, pa.Table):
        return any(_has_non_finite(chunk) for column in data.columns for chunk in column.chunks)
    dtype = data.type
    if pa.types.is_floating(dtype):
        return bool(pc.any(pc.invert(pc.is_finite(data))).as_py())
    if pa.types.is_struct(dtype):
        return any(_has_non_finite(pc.struct_field(data, i)) for i in range(dtype.num_fields))
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _has_non_finite(data.flatten())
    return False


def arrow_from_python(objects: Sequence[dict[str, Any]]) -> tuple[pa.Table, frozenset[str]]:
    """Columns from Python objects; a column whose values do not share a type becomes JSON text."""
    names: dict[str, None] = {}
    for obj in objects:
        names.update(dict.fromkeys(obj))
    columns: dict[str, pa.Array] = {}
    lossy: set[str] = set()
    for name in names:
        values = [obj.get(name) for obj in objects]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            lossy.add(name)
            columns[name] = pa.array(
                [v if v is None or isinstance(v, str) else json.dumps(v) for v in values], pa.string()
            )
    if not columns:
        return pa.table({"__empty": pa.nulls(len(objects))}).drop_columns(["__empty"]), frozenset()
    return pa.table(columns), frozenset(lossy)


def _loader(values: pa.Array) -> Callable[[], list[Any]]:
    """Python objects of ``values`` (each a vetted JSON object), parsed when first asked for."""
    return lambda: [json.loads(v.decode("utf-8")) for v in values.to_pylist()]


_SAMPLE = 64
"""Values (spread over the batch) whose routing fields give the types they are parsed as."""
_LEAF = 8
"""A failing group of at most this many values is parsed value by value to find the bad ones."""
_MISSES = 256
"""Failed parses allowed while isolating bad values; more, and the batch is parsed per record."""


def _path_value(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(name)
    return obj


def _routing_schema(values: pa.Array, fields: FieldPaths) -> pa.Schema | None:
    """The Arrow schema of just the routing fields, typed from :data:`_SAMPLE` values spread over
    the batch (record kinds often come in runs: the first values may all be orders).

    A field the sample never sets is read as a string (if it is not, the parse fails and the batch
    is parsed per record). ``None`` when the sample's values of a field do not share a type, or a
    path is a prefix of another (``customer`` and ``customer.id``): routing needs them per record.
    """
    if any(a != b and a == b[: len(a)] for a in fields for b in fields):
        return None
    picked = np.unique(np.linspace(0, len(values) - 1, num=min(_SAMPLE, len(values))).astype(np.int64))
    sample = [parse_json_value(v)[0] for v in values.take(pa.array(picked)).to_pylist()]
    tree: dict[str, Any] = {}
    for path in sorted(fields):
        found = [v for v in (_path_value(obj, path) for obj in sample) if v is not None]
        try:
            dtype = pa.array(found).type if found else pa.string()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return None
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = dtype

    def build(node: dict[str, Any]) -> list[pa.Field]:
        return [pa.field(k, pa.struct(build(v)) if isinstance(v, dict) else v) for k, v in node.items()]

    return pa.schema(build(tree))


def _parse_routing(
    values: pa.Array, schema: pa.Schema, joined: pa.Buffer
) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]] | None:
    """The routing fields of ``values`` in as few Arrow calls as the bad values allow.

    ``joined`` is :func:`_newline_joined` of ``values``, made once for this and the whole parse.
    Returns (table, indices of the values it holds, failures). A failing group is halved until it
    is :data:`_LEAF` values small; those are parsed one by one, which names the bad ones. ``None``
    when valid values still do not parse (a routing field changes type) or after :data:`_MISSES`
    failed parses (too many bad values to be worth it).
    """
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    tables: list[pa.Table] = []
    kept: list[np.ndarray] = []
    failures: list[tuple[int, str]] = []
    misses = 0

    def attempt(part: pa.Array) -> pa.Table | None:
        try:
            buffer = joined if len(part) == len(values) else _newline_joined(part)
            table = _arrow_read(buffer, options)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        return table if table.num_rows == len(part) else None

    def visit(lo: int, hi: int) -> bool:
        nonlocal misses
        table = attempt(values[lo:hi])
        if table is not None:
            tables.append(table)
            kept.append(np.arange(lo, hi, dtype=np.int64))
            return True
        misses += 1
        if misses > _MISSES:
            return False
        if hi - lo > _LEAF:
            mid = (lo + hi) // 2
            return visit(lo, mid) and visit(mid, hi)
        good: list[int] = []
        for index in range(lo, hi):
            _, reason = parse_json_value(values[index].as_py())
            if reason is None:
                good.append(index)
            else:
                failures.append((index, reason))
        if not good:
            return True
        indices = np.asarray(good, dtype=np.int64)
        table = attempt(values.take(pa.array(indices)))
        if table is None:
            return False
        tables.append(table)
        kept.append(indices)
        return True

    if not visit(0, len(values)):
        return None
    rows = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    empty = [name for name in table.column_names if table.column(name).null_count == table.num_rows]
    return table.drop_columns(empty), rows, failures


class JsonDecoder:
    """Batch JSON decoding with per-record isolation of bad values.

    Three ways, fastest first: the whole batch in one Arrow call; when its fields disagree on types,
    only the fields routing reads (``fields``), so each table's records are parsed in one call
    after routing (:attr:`Decoded.routed`); and value by value with :func:`json.loads` when neither
    works (a routing field that changes type, an int beyond int64, many bad values).

    ``per_record=True`` parses every value with :func:`json.loads` and builds Arrow from Python
    objects: the slow path, kept for the benchmark's comparison.
    """

    def __init__(self, per_record: bool = False) -> None:
        self.per_record = per_record
        self._known: dict[str | None, pa.Schema] = {}
        """Schema of the last batch (key ``None``) and of each table's records (see :meth:`subset`)."""

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        if len(values) == 0:
            return _empty()
        if self.per_record:
            return self._per_record(values)
        try:
            ok, failures = _screen(values)
        except _NotForArrow:
            return self._isolate(values)
        if len(ok) == 0:
            return Decoded(pa.table({}), ok, failures)
        candidates = values.take(pa.array(ok, pa.int64())) if failures else values
        joined = _newline_joined(candidates)
        whole = self._whole(candidates, None, joined)
        if whole is not None:
            return replace(whole, rows=ok, failures=failures)
        if fields is not None:
            routed = self._routed(candidates, fields, joined)
            if routed is not None:
                rows = ok[routed.rows]
                more = [(int(ok[i]), reason) for i, reason in routed.failures]
                return replace(routed, rows=rows, failures=sorted(failures + more))
        return self._isolate(values)

    def _whole(self, values: pa.Array, key: str | None, joined: pa.Buffer | None = None) -> Decoded | None:
        """``values`` (screened; ``joined`` if made already) in one Arrow call, or None when Arrow
        refuses them together."""
        try:
            buffer = joined if joined is not None else _newline_joined(values)
            table = _read_json(buffer, self._known.get(key))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        if table.num_rows != len(values) or _has_non_finite(table):
            return None
        self._remember(key, table.schema)
        return Decoded(table, np.arange(len(values), dtype=np.int64), _python=_loader(values))

    def _routed(self, values: pa.Array, fields: FieldPaths, joined: pa.Buffer) -> Decoded | None:
        """The routing fields of ``values`` (screened); each group's records parsed on request."""
        schema = _routing_schema(values, fields)
        if schema is None:
            return None
        parsed = _parse_routing(values, schema, joined)
        if parsed is None:
            return None
        table, rows, failures = parsed
        good = values.take(pa.array(rows, pa.int64())) if len(rows) != len(values) else values

        done: list[Decoded] = []  # groups parsed so far (without failures: rows are positions)

        def parse(positions: np.ndarray, key: str | None) -> Decoded:
            for earlier in done:
                # A table whose records another table holds too (orders, big orders) is taken
                # from that table's parse instead of parsing its values again.
                at = np.searchsorted(earlier.rows, positions)
                if (at < len(earlier.rows)).all() and np.array_equal(earlier.rows[at], positions):
                    return replace(earlier.subset(at), rows=positions)
            group = good.take(pa.array(positions, pa.int64()))
            decoded = self._whole(group, key) or self._isolate(group)
            result = replace(
                decoded,
                rows=positions[decoded.rows],
                failures=[(int(positions[i]), reason) for i, reason in decoded.failures],
            )
            if not result.failures:
                done.append(result)
            return result

        return Decoded(
            table, rows, failures, routed=frozenset(schema.names), _python=_loader(good), _parse=parse
        )

    def _remember(self, key: str | None, schema: pa.Schema) -> None:
        known = self._known.get(key)
        if known is None:
            if len(self._known) < 1000:
                self._known[key] = schema
            return
        fields = {f.name: f for f in known}
        fields.update({f.name: f for f in schema})
        self._known[key] = pa.schema(list(fields.values())) if len(fields) <= 1000 else schema

    @staticmethod
    def _parse_each(values: pa.Array) -> tuple[list[int], list[dict[str, Any]], list[tuple[int, str]]]:
        """Every value on its own: (good indices, their objects, failures)."""
        good: list[int] = []
        objects: list[dict[str, Any]] = []
        failures: list[tuple[int, str]] = []
        for index, value in enumerate(values.to_pylist()):
            obj, reason = parse_json_value(value)
            if obj is None:
                failures.append((index, reason or "not a JSON object"))
                continue
            good.append(index)
            objects.append(obj)
        return good, objects, failures

    def _per_record(self, values: pa.Array) -> Decoded:
        good, objects, failures = self._parse_each(values)
        table, lossy = arrow_from_python(objects)
        return Decoded(table, np.asarray(good, dtype=np.int64), failures, lossy=lossy, _python_cache=objects)

    def _isolate(self, values: pa.Array) -> Decoded:
        good, objects, failures = self._parse_each(values)
        rows = np.asarray(good, dtype=np.int64)
        if not good:
            return Decoded(pa.table({}), rows, failures)
        good_values = values.take(pa.array(rows))
        # json.loads has vetted each good value for Arrow's parser but for integers beyond int64.
        if not pc.any(pc.match_substring_regex(good_values, _BIG_INT)).as_py():
            try:
                table = _read_json(_newline_joined(good_values))
                if table.num_rows == len(good):
                    return Decoded(table, rows, failures, _python_cache=objects)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        table, lossy = arrow_from_python(objects)
        return Decoded(table, rows, failures, lossy=lossy, _python_cache=objects)


# --------------------------------------------------------------------------------------------
# Avro


def _decode_avro(
    values: list[bytes | None], schema: Any, arrow_schema: pa.Schema, skip: int = 0
) -> tuple[list[dict[str, Any]], list[int], list[tuple[int, str]]]:
    from fastavro import schemaless_reader

    objects: list[dict[str, Any]] = []
    good: list[int] = []
    failures: list[tuple[int, str]] = []
    for index, value in enumerate(values):
        if value is None:
            failures.append((index, "value is null"))
            continue
        stream = io.BytesIO(value)
        stream.seek(skip)
        try:
            obj = schemaless_reader(stream, schema, None)
        except Exception as exc:  # fastavro raises many types on bad input
            failures.append((index, f"invalid Avro for the writer schema: {type(exc).__name__}: {exc}"))
            continue
        if stream.tell() != len(value):
            failures.append((index, f"invalid Avro: {len(value) - stream.tell()} trailing bytes"))
            continue
        if not isinstance(obj, dict):
            failures.append((index, "Avro value is not a record"))
            continue
        good.append(index)
        objects.append(obj)
    return objects, good, failures


def _avro_table(objects: list[dict[str, Any]], arrow_schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(objects, schema=arrow_schema)


class AvroDecoder:
    """Schemaless Avro values written with one known schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        from fastavro import parse_schema

        self.schema = parse_schema(schema)
        self.arrow_schema = avro_to_arrow_schema(schema)

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """``fields`` is not needed: every value is decoded with its writer schema."""
        if len(values) == 0:
            return _empty()
        objects, good, failures = _decode_avro(values.to_pylist(), self.schema, self.arrow_schema)
        table = _avro_table(objects, self.arrow_schema)
        return Decoded(table, np.asarray(good, dtype=np.int64), failures, _python_cache=objects)


class ConfluentAvroDecoder:
    """Confluent wire-format Avro; writer schemas resolved through the Schema Registry, cached per id."""

    MAGIC = 0

    def __init__(self, registry_conf: dict[str, str]) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self._client = SchemaRegistryClient(dict(registry_conf))
        self._schemas: dict[int, tuple[Any, pa.Schema] | str] = {}
        self._lock = threading.Lock()

    def schema(self, schema_id: int) -> tuple[Any, pa.Schema] | str:
        """Parsed writer schema and Arrow schema for an id, or the reason it is unusable."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from fastavro import parse_schema

        with self._lock:
            cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        try:
            registered = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                result: tuple[Any, pa.Schema] | str = (
                    f"unknown schema id {schema_id} in the Schema Registry; "
                    "check source.schema-registry.url points at the producer's registry"
                )
            else:
                raise SchemaError(f"Schema Registry lookup of schema id {schema_id} failed: {exc}") from exc
        else:
            if (registered.schema_type or "AVRO") != "AVRO":
                result = f"schema id {schema_id} is {registered.schema_type}, not AVRO"
            else:
                try:
                    # Named types defined in referenced subjects, deepest first: fastavro and the
                    # Arrow mapping both need a name's definition before its first use.
                    parsed: dict[str, Any] = {}
                    arrow: dict[str, pa.DataType] = {}
                    for referenced in self._references(registered, set()):
                        parse_schema(referenced, named_schemas=parsed)
                        avro_to_arrow_type(referenced, arrow)
                    raw = json.loads(registered.schema_str or "")
                    result = (parse_schema(raw, named_schemas=parsed), avro_to_arrow_schema(raw, arrow))
                except SchemaRegistryError as exc:
                    if exc.http_status_code != 404:
                        raise SchemaError(
                            f"Schema Registry lookup of schema id {schema_id}'s references failed: {exc}"
                        ) from exc
                    result = f"schema id {schema_id} references a schema the registry does not have: {exc}"
                except (ValueError, SchemaError) as exc:
                    result = f"schema id {schema_id} cannot be used: {exc}"
        with self._lock:
            self._schemas[schema_id] = result
        return result

    def _references(self, schema: Any, seen: set[str]) -> list[dict[str, Any]]:
        """The schemas ``schema`` references (Avro named types registered as their own subjects),
        each after the ones it references; a subject reached twice is taken once."""
        found: list[dict[str, Any]] = []
        for reference in schema.references or []:
            if reference.subject in seen:
                continue
            seen.add(reference.subject)
            version = self._client.get_version(reference.subject, reference.version)
            found += self._references(version.schema, seen)
            found.append(json.loads(version.schema.schema_str or ""))
        return found

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """``fields`` is not needed: every value is decoded with its writer schema."""
        if len(values) == 0:
            return _empty()
        raw = values.to_pylist()
        failures: list[tuple[int, str]] = []
        by_id: dict[int, list[int]] = {}
        for index, value in enumerate(raw):
            if value is None or len(value) < 5 or value[0] != self.MAGIC:
                failures.append(
                    (
                        index,
                        "not Confluent wire format (magic byte 0, 4-byte schema id); is source.format right?",
                    )
                )
                continue
            by_id.setdefault(int.from_bytes(value[1:5], "big"), []).append(index)
        parts: list[pa.Table] = []
        rows: list[int] = []
        objects: list[dict[str, Any]] = []
        for schema_id, indices in by_id.items():
            resolved = self.schema(schema_id)
            if isinstance(resolved, str):
                failures.extend((i, resolved) for i in indices)
                continue
            writer, arrow_schema = resolved
            objs, good, bad = _decode_avro([raw[i] for i in indices], writer, arrow_schema, skip=5)
            failures.extend((indices[i], reason) for i, reason in bad)
            parts.append(_avro_table(objs, arrow_schema))
            rows.extend(indices[i] for i in good)
            objects.extend(objs)
        return _in_input_order(parts, rows, objects, failures)


def _in_input_order(
    parts: list[pa.Table],
    rows: list[int],
    objects: list[dict[str, Any]] | None,
    failures: list[tuple[int, str]],
    lossy: frozenset[str] = frozenset(),
) -> Decoded:
    """One :class:`Decoded` from tables decoded per writer schema: ``rows`` are the input indices of
    the parts' rows (in part order), ``objects`` their records (None: made from the table when
    asked for); rows are put back in input order."""
    failures.sort()
    if not parts:
        return Decoded(pa.table({}), np.zeros(0, dtype=np.int64), failures)
    if len(parts) == 1:
        table = parts[0]
    else:
        # A column one writer schema lacks is null in its rows: required columns become optional
        # (left required, the concatenated table would hold nulls its schema says cannot be).
        shared = set.intersection(*(set(p.column_names) for p in parts))
        table = pa.concat_tables([_optional(p, shared) for p in parts], promote_options="permissive")
    order = np.argsort(np.asarray(rows, dtype=np.int64), kind="stable")
    table = table.take(pa.array(order))
    ordered = None if objects is None else [objects[i] for i in order]
    positions = np.asarray(rows, dtype=np.int64)[order]
    return Decoded(table, positions, failures, lossy=lossy, _python_cache=ordered)


def _optional(table: pa.Table, shared: set[str]) -> pa.Table:
    """``table`` with its columns outside ``shared`` nullable."""
    if shared.issuperset(table.column_names):
        return table
    fields = [f if f.name in shared else f.with_nullable(True) for f in table.schema]
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


class RecordReader(Protocol):
    """Reads one value of a registry format (:mod:`~fanout_sink.transform.registry_formats`)."""

    def read(self, value: bytes) -> tuple[Hashable, dict[str, Any]] | str:
        """(key of the value's writer schema, its record), or why it cannot be read."""
        ...

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        """The columns a key's records have, or None when their values type the columns."""
        ...


class RegistryDecoder:
    """Schema Registry Protobuf or JSON Schema values, read by confluent-kafka's deserializers
    (:mod:`fanout_sink.transform.registry_formats`), one Arrow table per writer schema.

    A reader's Arrow schema (Protobuf: from the descriptor; JSON Schema: when the schema fixes the
    columns) types them; without one they are built from the records as for ``format: json``,
    JSON text where a field's values do not share a type.
    """

    def __init__(self, reader: RecordReader) -> None:
        self.reader = reader

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """``fields`` is not needed: every value is decoded with its writer schema."""
        if len(values) == 0:
            return _empty()
        failures: list[tuple[int, str]] = []
        groups: dict[Hashable, tuple[list[int], list[dict[str, Any]]]] = {}
        for index, value in enumerate(values.to_pylist()):
            if value is None:
                failures.append((index, "value is null"))
                continue
            read = self.reader.read(value)
            if isinstance(read, str):
                failures.append((index, read))
                continue
            key, record = read
            indices, records = groups.setdefault(key, ([], []))
            indices.append(index)
            records.append(record)
        parts: list[pa.Table] = []
        rows: list[int] = []
        objects: list[dict[str, Any]] | None = []
        lossy: frozenset[str] = frozenset()
        for key, (indices, records) in groups.items():
            schema = self.reader.arrow_schema(key)
            table = None
            if schema is not None:
                try:
                    table = pa.Table.from_pylist(records, schema=schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    pass  # a JSON integer beyond int64: the values type the columns
                else:
                    # Records may hold timestamps as epoch microseconds and maps as pairs (what
                    # Arrow takes fastest): routing's Python view is made from the table instead.
                    objects = None
            if table is None:
                table, more = arrow_from_python(records)
                lossy |= more
            parts.append(table)
            rows.extend(indices)
            if objects is not None:
                objects.extend(records)
        return _in_input_order(parts, rows, objects, failures, lossy)


def build_decoder(config: SinkConfig) -> Decoder:
    """The decoder for ``config.source`` (a :class:`~fanout_sink.config.SinkConfig`)."""
    source = config.source
    if source.format == "json":
        return JsonDecoder()
    if source.format == "avro":
        assert source.schema_file is not None, "the config requires source.schema for avro"
        path = config.resolve(source.schema_file)
        try:
            return AvroDecoder(load_avro_schema(path))
        except SchemaError as exc:
            raise ConfigError(config.name, "source.schema", str(exc), 'e.g. "schemas/order.avsc"') from None
    if source.format == "confluent-avro":
        return ConfluentAvroDecoder(source.schema_registry)
    # Imported here: the registry's Protobuf and JSON Schema libraries take a second or more to
    # import, which every process of a sink reading another format would pay.
    from fanout_sink.transform.registry_formats import registry_reader

    return RegistryDecoder(registry_reader(source.format, source.schema_registry))
