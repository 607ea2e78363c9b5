"""``format: json``: one JSON object per Kafka value, a whole batch decoded in as few Arrow calls
as the values allow.

The batch is newline-joined in Arrow and parsed by ``pyarrow.json.read_json`` in one call. Strings
stay strings (Arrow's timestamp inference is undone: conversion parses timestamps per the table's
column type). Whole-batch kernels screen the values first, so the few bad ones are dead-lettered
without parsing the rest one by one. When a field carries different JSON types for different
record kinds (string amounts on orders, numbers on payments), the batch is no single Arrow table:
then only the fields routing reads are parsed in one call (the others are ignored), and after
routing each table's records are parsed in one call (:meth:`Decoded.subset`); a bad value that the
screening missed is found by halving. Only what that cannot handle (a routing field that itself
changes type, many bad values) is parsed value by value with :func:`json.loads`.

A value must be UTF-8 (not guessed: ``json.loads`` of bytes would read UTF-16 or UTF-32), hold no
``NaN``/``Infinity`` (not JSON; Arrow's parser accepts them) nor unpaired surrogate escapes, and be
at most :data:`MAX_NESTING` levels deep: Arrow's parser overflows the C stack (a segfault) at about
20 000 levels and Python's recursion limit is near 1 000, so depth is measured before parsing.
Only values that start as an object and hold no raw line break inside a string reach Arrow's
parser (a top-level ``null`` first in its input segfaults it; the newline join would turn the
line break into a space). Neither do integers beyond int64: Arrow would make their whole column
double and round every large id in the batch; they are built from exact Python ints instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from fanout_sink.transform.formats.decoded import (
    Decoded,
    FieldPaths,
    arrow_from_python,
    no_records,
    value_bytes,
)

MAX_NESTING = 64
"""Deepest JSON nesting (objects and arrays) a value may have; deeper values are dead-lettered."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BIG_INT = r"(?:^|[\[:,])\s*-?\d{19,}\s*(?:[\]},]|$)"
"""An integer token of 19 or more digits: it may not fit int64 (a cheap, conservative test)."""
_BIG_INT_TOKEN = re.compile(_BIG_INT.encode())
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A high (d800-dbff) or low (dc00-dfff) surrogate escape: either may stand unpaired."""


def _nesting(value: bytes) -> int:
    """How deep objects and arrays nest in ``value`` (brackets inside strings do not count)."""
    brackets = np.frombuffer(_STRING.sub(b"", value), dtype=np.uint8)
    steps = np.zeros(len(brackets), dtype=np.int64)
    steps[(brackets == ord("[")) | (brackets == ord("{"))] = 1
    steps[(brackets == ord("]")) | (brackets == ord("}"))] = -1
    return int(np.cumsum(steps).max(initial=0))


def _may_nest_too_deep(values: pa.Array) -> np.ndarray:
    """Indices of values with more opening brackets than :data:`MAX_NESTING` (depth then decides).

    Counted in numpy over the array's one data buffer: a quarter of the time of Arrow's substring
    counting kernels, which matters because every batch is screened.
    """
    data, bounds = value_bytes(values)
    opening = np.flatnonzero((data == ord("[")) | (data == ord("{")))
    return np.flatnonzero(np.diff(np.searchsorted(opening, bounds)) > MAX_NESTING)


def _not_an_object_first(values: pa.Array) -> np.ndarray:
    """Indices of values that do not start with ``{`` (whitespace first is rare: then they are
    merely parsed on their own)."""
    data, bounds = value_bytes(values)
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


class NotForArrow(Exception):
    """A valid value Arrow's parser cannot take (an int beyond int64): parse the batch per record."""


def screen(values: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Which values Arrow's parser may see: (their indices, failures of the others).

    Whole-batch kernels pick the few suspects, and only those are looked at one by one. Null, not
    UTF-8, not starting with ``{`` (a ``null`` first in the buffer segfaults the parser), ``NaN``
    or ``Infinity`` (Arrow's parser takes them): parsed on their own, which gives a failure's
    reason or shows a false alarm (``"NaN"`` in a string). A big int, a line break (inside a string
    it is invalid JSON the newline join would hide), too many brackets: :func:`_unsafe` decides,
    so pretty-printed values are not parsed one by one. A valid value Arrow cannot take raises
    :class:`NotForArrow`: Arrow would make an int beyond int64's whole column double.
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
            raise NotForArrow(index)
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


def newline_joined(values: pa.Array) -> pa.Buffer:
    """The values as one newline-delimited buffer; line breaks inside values become spaces.

    A line break can only sit between tokens of valid JSON, so replacing it keeps the value's
    meaning and keeps one value per line. Values rarely hold one: numpy looks first, which costs a
    tenth of the replacing.
    """
    return _lines(values)[0]


def _lines(values: pa.Array) -> tuple[pa.Buffer, np.ndarray]:
    """:func:`newline_joined` and the ``len + 1`` bounds of each value's line in it."""
    data, bounds = value_bytes(values)
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
    return data.slice(start, end - start), offsets - start


def _read_json(buffer: pa.Buffer, known: pa.Schema | None = None) -> pa.Table:
    """Newline-delimited JSON objects -> Arrow, strings kept as strings.

    With ``known`` (the schema of an earlier batch) one parse usually suffices; columns of the
    known schema that are entirely null in this batch are dropped again, so one batch's fields do
    not leak into another's.
    """
    if known is not None:
        try:
            options = pa_json.ParseOptions(explicit_schema=known, unexpected_field_behavior="infer")
            table = arrow_read(buffer, options)
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
    table = arrow_read(buffer)
    schema = pa.schema([f.with_type(_without_timestamps(f.type)) for f in table.schema])
    if schema.equals(table.schema):
        return table
    return arrow_read(buffer, pa_json.ParseOptions(explicit_schema=schema))


ONE_BLOCK = pa_json.ReadOptions().block_size
"""Arrow parses JSON in blocks of this many bytes (1 MiB), a block per thread."""
_SERIAL = pa_json.ReadOptions(use_threads=False)


def arrow_read(buffer: pa.Buffer, options: pa_json.ParseOptions | None = None) -> pa.Table:
    """Arrow's JSON reader, refusing what it builds wrong: a list with a null before its other
    elements (``[null, false]``, ``[null, null]``) becomes an invalid array whose offsets pass the
    end of its values, which crashes whatever reads it next. Validating costs microseconds.

    A buffer of one block is parsed on the calling thread: handing it to Arrow's pool parallelises
    nothing and costs a third of a small parse's CPU and most of its wall time (40 records: 0.29 ms
    CPU and 0.72 ms wall, against 0.22 and 0.46; a sink of thousands of one-table partitions parses
    a few dozen records per slice, thousands of times a batch)."""
    read_options = _SERIAL if buffer.size <= ONE_BLOCK else None
    table = pa_json.read_json(pa.BufferReader(buffer), read_options=read_options, parse_options=options)
    table.validate()  # raises ArrowInvalid; the caller parses the values another way
    return table


def _has_timestamp(dtype: pa.DataType) -> bool:
    return not _without_timestamps(dtype).equals(dtype)


def has_non_finite(data: pa.Table | pa.Array) -> bool:
    """Whether any float (at any depth) is NaN or infinite: Arrow's parser took a ``NaN`` literal.

    Only columns and fields that can hold a float are looked at (a mixed-type chunk asks this of
    each table's records: unpacking every struct and list of 50 tables per chunk cost more than
    the check)."""
    if isinstance(data, pa.Table):
        columns = [column for column in data.columns if _holds_float(column.type)]
        return any(has_non_finite(chunk) for column in columns for chunk in column.chunks)
    dtype = data.type
    if pa.types.is_floating(dtype):
        return bool(pc.any(pc.invert(pc.is_finite(data))).as_py())
    if pa.types.is_struct(dtype):
        fields = [i for i in range(dtype.num_fields) if _holds_float(dtype.field(i).type)]
        return any(has_non_finite(pc.struct_field(data, i)) for i in fields)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return has_non_finite(data.flatten())
    return False


def _holds_float(dtype: pa.DataType) -> bool:
    if pa.types.is_floating(dtype):
        return True
    if pa.types.is_struct(dtype):
        return any(_holds_float(field.type) for field in dtype)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _holds_float(dtype.value_type)
    return False


def python_loader(values: pa.Array) -> Callable[[], list[Any]]:
    """Python objects of ``values`` (each a vetted JSON object), parsed when first asked for."""
    return lambda: [json.loads(v.decode("utf-8")) for v in values.to_pylist()]


SAMPLE = 64
"""Values (spread over the batch) whose routing fields give the types they are parsed as."""
LEAF = 8
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
    """The Arrow schema of just the routing fields, typed from :data:`SAMPLE` values spread over
    the batch (record kinds often come in runs: the first values may all be orders).

    A field the sample never sets is read as a string (if it is not, the parse fails and the batch
    is parsed per record). ``None`` when the sample's values of a field do not share a type, or a
    path is a prefix of another (``customer`` and ``customer.id``): routing needs them per record.
    """
    if any(a != b and a == b[: len(a)] for a in fields for b in fields):
        return None
    picked = np.unique(np.linspace(0, len(values) - 1, num=min(SAMPLE, len(values))).astype(np.int64))
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

    ``joined`` is :func:`newline_joined` of ``values``, made once for this and the whole parse.
    Returns (table, indices of the values it holds, failures). A failing group is halved until it
    is :data:`LEAF` values small; those are parsed one by one, which names the bad ones. ``None``
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
            buffer = joined if len(part) == len(values) else newline_joined(part)
            table = arrow_read(buffer, options)
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
        if hi - lo > LEAF:
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
            return no_records()
        if self.per_record:
            return self._per_record(values)
        try:
            ok, failures = screen(values)
        except NotForArrow:
            return self._isolate(values)
        if len(ok) == 0:
            return Decoded(pa.table({}), ok, failures)
        candidates = values.take(pa.array(ok, pa.int64())) if failures else values
        joined = newline_joined(candidates)
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
            buffer = joined if joined is not None else newline_joined(values)
            table = _read_json(buffer, self._known.get(key))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        if table.num_rows != len(values) or has_non_finite(table):
            return None
        self._remember(key, table.schema)
        return Decoded(table, np.arange(len(values), dtype=np.int64), _python=python_loader(values))

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
        in_done = np.zeros(len(good), dtype=bool)  # the values some group in ``done`` holds
        lines: dict[str | None, tuple[np.ndarray, pa.Array, pa.Buffer]] = {}

        def expect(groups: Mapping[str, np.ndarray]) -> None:
            # Every group's values in one take and one join, each group a slice of them: a take
            # and a join per table cost a third as much as parsing its records.
            keys = [key for key, positions in groups.items() if len(positions)]
            if len(keys) < 2:
                return
            taken = good.take(pa.array(np.concatenate([groups[key] for key in keys]), pa.int64()))
            joined, bounds = _lines(taken)
            start = 0
            for key in keys:
                end = start + len(groups[key])
                line = joined.slice(int(bounds[start]), int(bounds[end] - bounds[start]))
                lines[key] = (groups[key], taken.slice(start, end - start), line)
                start = end

        def parse(positions: np.ndarray, key: str | None) -> Decoded:
            # A table whose records another table holds too (orders, big orders) is taken from
            # that table's parse instead of parsing its values again. Looked for only when every
            # value was parsed already: with disjoint tables (50 of them, routed on one field)
            # searching each earlier group cost more than the parses.
            for earlier in done if in_done[positions].all() else ():
                at = np.searchsorted(earlier.rows, positions)
                if (at < len(earlier.rows)).all() and np.array_equal(earlier.rows[at], positions):
                    return replace(earlier.subset(at), rows=positions)
            expected = lines.pop(key, None)
            if expected is not None and np.array_equal(expected[0], positions):
                group, joined = expected[1], expected[2]
            else:
                group, joined = good.take(pa.array(positions, pa.int64())), None
            decoded = self._whole(group, key, joined) or self._isolate(group)
            result = replace(
                decoded,
                rows=positions[decoded.rows],
                failures=[(int(positions[i]), reason) for i, reason in decoded.failures],
            )
            if not result.failures:
                done.append(result)
                in_done[result.rows] = True
            return result

        routed, loader = frozenset(schema.names), python_loader(good)
        return Decoded(table, rows, failures, routed=routed, _python=loader, _parse=parse, _expect=expect)

    def known_schema(self) -> pa.Schema | None:
        """The fields of the batches so far, as the next batch's parse is given them first."""
        return self._known.get(None)

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
                table = _read_json(newline_joined(good_values))
                if table.num_rows == len(good):
                    return Decoded(table, rows, failures, _python_cache=objects)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        table, lossy = arrow_from_python(objects)
        return Decoded(table, rows, failures, lossy=lossy, _python_cache=objects)
