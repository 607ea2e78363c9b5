"""What every decoder returns and the pieces decoders of several formats share.

A decoder (:class:`Decoder`) turns a batch of Kafka values into a :class:`Decoded`: the records as
an Arrow table, the input index of each record's row, and the failures (input index, reason) that
become dead letters. :func:`arrow_from_python` types columns from Python records (JSON values,
registry records whose schema does not fix the columns); :func:`in_input_order` joins tables
decoded per writer schema back into input order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

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
    _expect: Callable[[Mapping[str, np.ndarray]], None] | None = None

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

    def expect(self, groups: Mapping[str, np.ndarray]) -> None:
        """Tells which :meth:`subset` calls come next (key -> positions), so a decoder that parses
        each group on its own can prepare all of them in one pass."""
        if self._expect is not None:
            self._expect(groups)

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


def no_records() -> Decoded:
    """The result of an empty batch."""
    return Decoded(pa.table({}), np.zeros(0, dtype=np.int64))


def value_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The bytes behind a binary or string array and the ``len + 1`` bounds of its values (no copy)."""
    wide = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    offsets, data = values.buffers()[1:3]
    if offsets is None:  # an empty array
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return raw, bounds[values.offset : values.offset + len(values) + 1]


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


def in_input_order(
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


class Undecodable(Exception):
    """A value that is not a record of its writer schema; the message is the dead letter's reason."""
