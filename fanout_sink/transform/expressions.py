"""jmespath expressions over a batch of records, compiled to ``pyarrow.compute`` where possible.

Expressions are jmespath, evaluated over a *record view* (:mod:`fanout_sink.transform.record_view`:
the record's own fields at top level, plus its Kafka metadata, always reachable under ``_kafka``).
Besides jmespath's built-in functions there is ``regex(subject, 'pattern')``: true when ``pattern``
matches anywhere in the string ``subject`` (:mod:`fanout_sink.config.jmespath_functions`, which the
config checks every call against on load). A predicate that raises on a record (``starts_with`` of a
number or of a missing field) neither matches nor misses it: :meth:`Predicate.evaluate` names the
record and jmespath's reason, and routing makes it a bad record (issue 47 item 5: read as false, a
``when`` that raised filtered its records without a word).

Simple predicates -- a field compared with a literal (``==``, ``!=``, ``<``, ``<=``, ``>``,
``>=``), membership ``contains(['a', 'b'], field)``, ``contains``/``starts_with``/``ends_with``/
``regex`` on a string field, a bare field's truthiness, and ``&&``, ``||``, ``!`` of those -- are
compiled to ``pyarrow.compute`` and run on whole columns. Everything else runs per record through
jmespath over Python objects; both give the same answer (the routing tests check that with
hypothesis). Projections (``select``) of the form ``{name: field.path, ...}`` and dynamic names that
are a field or ``join('<sep>', [<'literal' or field.path>, ...])`` are vectorised the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jmespath
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.config.jmespath_functions import JMESPATH_OPTIONS
from fanout_sink.transform.formats.decoded import arrow_from_python
from fanout_sink.transform.record_view import META_ROOT, Fallback, RecordView

EVALUATION_ERRORS = (jmespath.exceptions.JMESPathError, TypeError, ValueError, re.error)
"""What evaluating an expression on one record raises when the record does not suit it."""


# --------------------------------------------------------------------------------------------
# Vectorised evaluation of a jmespath AST


def _path(node: dict[str, Any]) -> list[str] | None:
    """``a`` or ``a.b.c`` as a list of names; None for anything else."""
    if node["type"] == "field":
        return [node["value"]]
    if node["type"] == "subexpression":
        names: list[str] = []
        for child in node["children"]:
            sub = _path(child)
            if sub is None:
                return None
            names.extend(sub)
        return names
    return None


_COMBINING = {
    "comparator",
    "and_expression",
    "or_expression",
    "not_expression",
    "function_expression",
    "multi_select_list",
}


def field_paths(node: dict[str, Any]) -> set[tuple[str, ...]] | None:
    """The record field paths an expression reads (``_kafka`` metadata left out), or ``None`` when
    it reads the record in a way no path names (``@``, projections, indexes, ``&`` references)."""
    names = _path(node)
    if names is not None:
        return set() if names[0] == META_ROOT else {tuple(names)}
    if node["type"] == "literal":
        return set()
    if node["type"] not in _COMBINING:
        return None
    paths: set[tuple[str, ...]] = set()
    for child in node["children"]:
        found = field_paths(child)
        if found is None:
            return None
        paths |= found
    return paths


def string_column(view: RecordView, path: tuple[str, ...]) -> pa.Array | None:
    """The field at ``path`` when it is a string column for every record, as ``==`` against a string
    literal compares it; ``None`` when a comparison would take another way (other types, fallback)."""
    try:
        column = _resolve(view, list(path))
    except NOT_VECTORISABLE:
        return None
    return column if _family(column.type) == "string" else None


def _resolve(view: RecordView, names: list[str]) -> pa.Array:
    array = view.column(names[0])
    for name in names[1:]:
        if names[0] == "headers" or (names[0] == META_ROOT and name == "headers"):
            raise Fallback("headers are evaluated per record")
        if pa.types.is_struct(array.type) and array.type.get_field_index(name) >= 0:
            child = pc.struct_field(array, name)
            if array.null_count:
                child = pc.if_else(array.is_valid(), child, pa.nulls(len(array), child.type))
            array = child
        else:
            array = pa.nulls(len(array))
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _family(dtype: pa.DataType) -> str:
    if pa.types.is_null(dtype):
        return "null"
    if pa.types.is_boolean(dtype):
        return "bool"
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "number"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    return "other"


def _literal_family(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


_FLIP = {"lt": "gt", "lte": "gte", "gt": "lt", "gte": "lte", "eq": "eq", "ne": "ne"}
_ARROW_CMP = {
    "eq": pc.equal,
    "ne": pc.not_equal,
    "lt": pc.less,
    "lte": pc.less_equal,
    "gt": pc.greater,
    "gte": pc.greater_equal,
}


def _const(view: RecordView, value: bool) -> pa.Array:
    return pa.array(np.full(len(view), value, dtype=bool))


def _comparator(view: RecordView, node: dict[str, Any]) -> pa.Array:
    op = node["value"]
    left, right = node["children"]
    if left["type"] == "literal" and _path(right) is not None:
        left, right, op = right, left, _FLIP[op]
    names = _path(left)
    if names is None or right["type"] != "literal":
        raise Fallback("comparison is not field-versus-literal")
    column = _resolve(view, names)
    literal = right["value"]
    col_family, lit_family = _family(column.type), _literal_family(literal)
    if op in {"eq", "ne"}:
        if lit_family == "null":
            result = column.is_null() if op == "eq" else column.is_valid()
            return result
        if col_family == "null":
            return _const(view, op == "ne")
        if col_family != lit_family or col_family == "other":
            raise Fallback("types differ")
        compared = _ARROW_CMP[op](column, pa.scalar(literal, column.type if col_family != "number" else None))
        return compared.fill_null(op == "ne")
    if col_family == "null":
        return _const(view, False)
    if col_family != lit_family or col_family not in {"number", "string"}:
        raise Fallback("ordering needs two numbers or two strings")
    return _ARROW_CMP[op](column, pa.scalar(literal)).fill_null(False)


def _string_arg(view: RecordView, node: dict[str, Any]) -> pa.Array:
    names = _path(node)
    if names is None:
        raise Fallback("not a field")
    column = _resolve(view, names)
    if _family(column.type) not in {"string", "null"}:
        raise Fallback("not a string column")
    return column


def _literal_list(node: dict[str, Any]) -> list[Any] | None:
    if node["type"] == "literal" and isinstance(node["value"], list):
        return list(node["value"])
    if node["type"] == "multi_select_list" and all(c["type"] == "literal" for c in node["children"]):
        return [c["value"] for c in node["children"]]
    return None


def _function(view: RecordView, node: dict[str, Any]) -> tuple[pa.Array, pa.Array | None]:
    name, args = node["value"], node["children"]
    if len(args) != 2:
        raise Fallback(f"function {name}")
    subject, needle = args
    values = _literal_list(subject)
    if name == "contains" and values is not None:
        names = _path(needle)
        if names is None:
            raise Fallback("contains needle is not a field")
        column = _resolve(view, names)
        has_null = any(v is None for v in values)
        non_null = [v for v in values if v is not None]
        family = _family(column.type)
        if family == "null":
            return _const(view, has_null), None
        if family == "other" or any(_literal_family(v) != family for v in non_null):
            raise Fallback("membership types differ")
        if not non_null:
            return (column.is_null() if has_null else _const(view, False)), None
        found = pc.is_in(column, value_set=pa.array(non_null, column.type if family != "number" else None))
        return pc.if_else(column.is_null(), has_null, found), None
    if needle["type"] != "literal" or not isinstance(needle["value"], str):
        raise Fallback(f"function {name} needs a string literal")
    pattern = needle["value"]
    if name in {"contains", "starts_with", "ends_with", "regex"}:
        column = _string_arg(view, subject)
        # jmespath raises on a non-string subject for all but regex (which is false there).
        error = None if name == "regex" else column.is_null()
        if _family(column.type) == "null":
            return _const(view, False), error
        kernels: dict[str, Callable[..., pa.Array]] = {
            "contains": pc.match_substring,
            "starts_with": pc.starts_with,
            "ends_with": pc.ends_with,
            "regex": pc.match_substring_regex,
        }
        return kernels[name](column, pattern).fill_null(False), error
    raise Fallback(f"function {name}")


def _truthy_column(view: RecordView, column: pa.Array) -> pa.Array:
    family = _family(column.type)
    if family == "null":
        return _const(view, False)
    if family == "bool":
        return column.fill_null(False)
    if family == "string":
        return pc.greater(pc.utf8_length(column), 0).fill_null(False)
    if family == "number":
        return column.is_valid()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pc.greater(pc.list_value_length(column), 0).fill_null(False)
    raise Fallback("truthiness of this type")


def _truth(view: RecordView, node: dict[str, Any]) -> tuple[pa.Array, pa.Array | None]:
    """(jmespath truthiness of ``node`` per record, the records on which jmespath raises, e.g.
    ``starts_with`` of a null, or None when it cannot); ``&&`` and ``||`` short-circuit like jmespath."""
    kind = node["type"]
    if kind == "comparator":
        return _comparator(view, node), None
    if kind == "function_expression":
        return _function(view, node)
    if kind in {"and_expression", "or_expression"}:
        left, left_error = _truth(view, node["children"][0])
        right, right_error = _truth(view, node["children"][1])
        if kind == "and_expression":
            mask = pc.and_(left, right)
            reached = left  # the right side runs only when the left is truthy
        else:
            mask = pc.or_(left, right)
            reached = pc.invert(left)
        error = left_error
        if right_error is not None:
            right_reached = pc.and_(reached, right_error)
            error = right_reached if error is None else pc.or_(error, right_reached)
        return mask, error
    if kind == "not_expression":
        mask, error = _truth(view, node["children"][0])
        return pc.invert(mask), error
    if kind == "literal":
        value = node["value"]
        return _const(view, _truthy(value)), None
    names = _path(node)
    if names is not None:
        return _truthy_column(view, _resolve(view, names)), None
    raise Fallback(f"{kind} expression")


def _truthy(value: Any) -> bool:
    """jmespath truthiness: false, null, "", [] and {} are false; 0 is true."""
    return not (value is None or value is False or value in ("", [], {}))


# --------------------------------------------------------------------------------------------
# Expressions


NOT_VECTORISABLE = (Fallback, pa.ArrowNotImplementedError, pa.ArrowInvalid)
"""What sends an expression from the Arrow path to evaluating each record with jmespath."""


class _Expression:
    """A compiled jmespath expression and its AST, shared by the three kinds a route uses: each
    tries the vectorised Arrow path first and records whether it got it (``last_vectorised``), so
    that metrics and tests can tell a slow fallback from the fast path."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.compiled = jmespath.compile(expression)
        self._ast: dict[str, Any] = dict(self.compiled.parsed)
        self.paths = field_paths(self._ast)
        """The record fields it reads (``None``: not nameable; see :func:`field_paths`)."""
        self.last_vectorised = False


@dataclass(frozen=True)
class Matches:
    """What a predicate says of a view's records: ``mask`` holds for the records it matches,
    ``failed`` the (position, jmespath's reason) of each record it raised on, which is no match and
    no miss but a bad record."""

    mask: np.ndarray
    failed: list[tuple[int, str]]


class Predicate(_Expression):
    """A ``when`` (or ``delete-when``) expression: :meth:`evaluate` says for each record whether it
    matches, or why the expression failed on it."""

    def evaluate(self, view: RecordView, vectorised: bool = True) -> Matches:
        if len(view) == 0:
            return Matches(np.zeros(0, dtype=bool), [])
        if vectorised:
            try:
                truthy, error = _truth(view, self._ast)
            except NOT_VECTORISABLE:
                pass
            else:
                self.last_vectorised = True
                mask = np.asarray(truthy.to_numpy(zero_copy_only=False), dtype=bool)
                if error is None or not pc.any(error).as_py():
                    return Matches(mask, [])
                # The records it raised on (bad records, few as a rule) through jmespath, for its reason.
                raised = np.flatnonzero(np.asarray(error.to_numpy(zero_copy_only=False), dtype=bool))
                objects = view.python()
                again = self._per_record([objects[p] for p in raised.tolist()])
                mask[raised] = again.mask
                return Matches(mask, [(int(raised[i]), reason) for i, reason in again.failed])
        self.last_vectorised = False
        return self._per_record(view.python())

    def _per_record(self, objects: list[dict[str, Any]]) -> Matches:
        mask = np.zeros(len(objects), dtype=bool)
        failed: list[tuple[int, str]] = []
        for pos, obj in enumerate(objects):
            try:
                mask[pos] = _truthy(self.compiled.search(obj, options=JMESPATH_OPTIONS))
            except EVALUATION_ERRORS as exc:
                failed.append((pos, str(exc)))
        return Matches(mask, failed)

    def string_equality(self) -> tuple[tuple[str, ...], str] | None:
        """``(path, literal)`` when the expression is ``path == 'literal'`` (either way round) on a
        record field: many such predicates on one path are answered by one look at the column."""
        node = self._ast
        if node["type"] != "comparator" or node["value"] != "eq":
            return None
        left, right = node["children"]
        if left["type"] == "literal":
            left, right = right, left
        names = _path(left)
        if names is None or names[0] == META_ROOT or right["type"] != "literal":
            return None
        literal = right["value"]
        return (tuple(names), literal) if isinstance(literal, str) else None


class Projection(_Expression):
    """A ``select`` expression: each record -> an object (a row of the destination table)."""

    def apply(
        self, view: RecordView, positions: np.ndarray, vectorised: bool = True
    ) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
        """Rows for ``positions`` of the view; returns (rows, their positions, failures)."""
        if vectorised:
            try:
                table = self._vectorised(view, positions)
                self.last_vectorised = True
                return table, positions, []
            except NOT_VECTORISABLE:
                pass
        self.last_vectorised = False
        objects = view.python()
        rows: list[dict[str, Any]] = []
        good: list[int] = []
        failures: list[tuple[int, str]] = []
        for pos in positions.tolist():
            try:
                result = self.compiled.search(objects[pos], options=JMESPATH_OPTIONS)
            except EVALUATION_ERRORS as exc:
                failures.append((pos, f"select {self.expression!r} failed: {exc}"))
                continue
            if not isinstance(result, dict):
                kind = "null" if result is None else type(result).__name__
                failures.append((pos, f"select {self.expression!r} gave {kind}, not an object"))
                continue
            rows.append(result)
            good.append(pos)
        table, _ = arrow_from_python(rows)
        if table.num_columns == 0:
            table = pa.table({"__rows": pa.nulls(len(rows))}).drop_columns(["__rows"])
        return table, np.asarray(good, dtype=np.int64), failures

    def _vectorised(self, view: RecordView, positions: np.ndarray) -> pa.Table:
        node = self._ast
        if node["type"] != "multi_select_dict":
            raise Fallback("select is not {name: field, ...}")
        every = np.array_equal(positions, np.arange(len(view)))  # a table's own view: no copy
        take = pa.array(positions, pa.int64())
        columns: dict[str, pa.Array] = {}
        for pair in node["children"]:
            names = _path(pair["children"][0])
            if names is None:
                raise Fallback("select value is not a field path")
            column = _resolve(view, names)
            columns[pair["value"]] = column if every else column.take(take)
        return pa.table(columns) if columns else pa.table({"_": pa.nulls(len(positions))}).drop_columns(["_"])


class NameExpression(_Expression):
    """A ``dynamic.table`` expression: each record -> a table name (or null: not dynamically routed)."""

    def names(self, view: RecordView, positions: np.ndarray, vectorised: bool = True) -> list[Any]:
        if vectorised:
            try:
                array = self._vectorised(view).take(pa.array(positions, pa.int64()))
                self.last_vectorised = True
                return list(array.to_pylist())
            except NOT_VECTORISABLE:
                pass
        self.last_vectorised = False
        objects = view.python()
        result: list[Any] = []
        for pos in positions.tolist():
            try:
                result.append(self.compiled.search(objects[pos], options=JMESPATH_OPTIONS))
            except EVALUATION_ERRORS:
                result.append(None)
        return result

    def array(self, view: RecordView, positions: np.ndarray) -> pa.Array | None:
        """Names for ``positions`` as an Arrow string column, or None when not vectorisable."""
        try:
            array = self._vectorised(view).take(pa.array(positions, pa.int64()))
        except NOT_VECTORISABLE:
            self.last_vectorised = False
            return None
        self.last_vectorised = True
        return array

    def _vectorised(self, view: RecordView) -> pa.Array:
        node = self._ast
        names = _path(node)
        if names is not None:
            column = _resolve(view, names)
            if _family(column.type) != "string":
                raise Fallback("name field is not a string column")
            return column
        if node["type"] == "function_expression" and node["value"] == "join" and len(node["children"]) == 2:
            sep, items = node["children"]
            if (
                sep["type"] != "literal"
                or not isinstance(sep["value"], str)
                or items["type"] != "multi_select_list"
            ):
                raise Fallback("join form")
            parts: list[Any] = []
            for item in items["children"]:
                if item["type"] == "literal" and isinstance(item["value"], str):
                    parts.append(pa.scalar(item["value"], pa.string()))
                    continue
                item_names = _path(item)
                if item_names is None:
                    raise Fallback("join part")
                column = _resolve(view, item_names)
                if _family(column.type) != "string":
                    raise Fallback("join part is not a string column")
                # A null part makes jmespath's join raise (no name: unmatched); Arrow gives null.
                parts.append(column.cast(pa.string()))
            return pc.binary_join_element_wise(*parts, pa.scalar(sep["value"], pa.string()))
        raise Fallback("name expression form")
