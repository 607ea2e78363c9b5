"""Routing: which tables each record goes to, and what it looks like there.

Each static table has a ``when`` predicate and an optional ``select`` projection; ``dynamic.table``
names tables from the records themselves, within ``dynamic.allow`` and the naming rules below; a
record no table takes follows ``unmatched``. The expressions are jmespath, compiled to Arrow where
possible by :mod:`fanout_sink.transform.expressions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fanout_sink.config.models import SinkConfig
from fanout_sink.transform.expressions import NameExpression, Predicate, string_column
from fanout_sink.transform.formats.decoded import FieldPaths
from fanout_sink.transform.record_view import RecordView

UNMATCHED_REASON = "no table matched the record (unmatched.action is dead-letter)"

# --------------------------------------------------------------------------------------------
# Dynamic names

_PART = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class NameRules:
    allow: str | None = None
    max_namespace_depth: int = 1
    max_name_length: int = 128


def normalise_table_name(raw: Any, rules: NameRules) -> tuple[str | None, str | None]:
    """``(identifier, None)`` for an acceptable dynamic name, ``(None, reason)`` for a rejected one.

    Lower case, ``-`` becomes ``_``; then every part must be ``[a-z_][a-z0-9_]*``, there must be one
    to ``max_namespace_depth`` namespace levels, the whole name at most ``max_name_length``
    characters, and it must match ``allow`` (full match).
    """
    if not isinstance(raw, str):
        return None, f"dynamic table name is a {type(raw).__name__}, not a string"
    shown = raw.encode("unicode_escape").decode("ascii")[:200]
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        return None, f"dynamic table name {shown!r} contains control characters"
    if "/" in raw or "\\" in raw:
        return None, f"dynamic table name {shown!r} contains a path separator"
    name = raw.strip().lower().replace("-", "_")
    parts = name.split(".")
    if any(not p for p in parts):
        return None, f"dynamic table name {shown!r} has an empty part ('..' or a leading/trailing dot)"
    if len(parts) < 2:
        return None, f"dynamic table name {shown!r} has no namespace; e.g. raw.{parts[0]}"
    if len(parts) - 1 > rules.max_namespace_depth:
        return None, (
            f"dynamic table name {shown!r} is {len(parts) - 1} namespaces deep; "
            f"dynamic.max-namespace-depth is {rules.max_namespace_depth}"
        )
    if len(name) > rules.max_name_length:
        return (
            None,
            f"dynamic table name is {len(name)} characters long; the limit is {rules.max_name_length}",
        )
    for part in parts:
        if not _PART.match(part):
            return None, f"dynamic table name {shown!r}: part {part!r} may hold only a-z, 0-9 and _"
    if rules.allow is not None and not re.fullmatch(rules.allow, name):
        return None, (
            f"dynamic table name {name!r} does not match dynamic.allow {rules.allow!r}; "
            "if the table is wanted, widen dynamic.allow"
        )
    return name, None


# --------------------------------------------------------------------------------------------
# The router


@dataclass
class Routes:
    """Where the records of a view go. Positions index the view (decoded records)."""

    tables: dict[str, np.ndarray] = field(default_factory=dict)
    dead: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    """(position, table, reason) of each record a table's ``when`` raised on: a bad record for that
    table, which is its outcome there (never "unmatched", never read as "no match")."""
    dropped: int = 0


def _equalities(rules: dict[str, Predicate | None]) -> dict[tuple[str, ...], dict[str, list[str]]]:
    """Per field path that at least two rules compare with ``==`` to a string: literal -> rules."""
    found: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for name, predicate in rules.items():
        equality = predicate.string_equality() if predicate is not None else None
        if equality is not None:
            path, literal = equality
            found.setdefault(path, {}).setdefault(literal, []).append(name)
    return {path: by_value for path, by_value in found.items() if sum(map(len, by_value.values())) > 1}


class Router:
    """Static rules, then dynamic names, then the unmatched policy."""

    def __init__(self, config: SinkConfig, vectorised: bool = True) -> None:
        self.config = config
        self.vectorised = vectorised
        self.default_table = config.unmatched.table if config.unmatched.action == "table" else None
        self.rules: dict[str, Predicate | None] = {
            name: (Predicate(s.when) if s.when is not None else None)
            for name, s in config.tables.items()
            if name != self.default_table
        }
        self.equalities = _equalities(self.rules)
        dyn = config.dynamic
        self.dynamic = NameExpression(dyn.table) if dyn is not None else None
        self.name_rules = (
            NameRules(dyn.allow, dyn.max_namespace_depth, dyn.max_name_length)
            if dyn is not None
            else NameRules()
        )
        self._name_cache: dict[str, tuple[str | None, str | None]] = {}
        self.fields = self._fields()
        """What routing reads of a record: the decoder may decode just that first (``None``: all)."""

    def _fields(self) -> FieldPaths | None:
        expressions: list[Predicate | NameExpression | None] = [*self.rules.values(), self.dynamic]
        paths: set[tuple[str, ...]] = set()
        for expression in expressions:
            if expression is None:
                continue
            if expression.paths is None:
                return None
            paths |= expression.paths
        return frozenset(paths)

    def _indexed(self, view: RecordView) -> tuple[dict[str, np.ndarray], set[str]]:
        """The masks of the rules in :attr:`equalities` that match some record, and every rule so
        answered, from one look at each path's column: 500 tables routed by ``t == '...'`` cost one
        dictionary encoding per slice, not 500 comparisons. A path that is not a string column here
        is left to each rule's own ``mask``."""
        masks: dict[str, np.ndarray] = {}
        answered: set[str] = set()
        for path, rules in self.equalities.items():
            column = string_column(view, path)
            if column is None:
                continue
            encoded = column.dictionary_encode()
            codes = np.asarray(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            for code, value in enumerate(encoded.dictionary.to_pylist()):
                for name in rules.get(value, ()):
                    masks[name] = codes == code
            answered.update(name for names in rules.values() for name in names)
        return masks, answered

    def _check_name(self, raw: Any) -> tuple[str | None, str | None]:
        if not isinstance(raw, str):
            return normalise_table_name(raw, self.name_rules)
        checked = self._name_cache.get(raw)
        if checked is None:
            checked = normalise_table_name(raw, self.name_rules)
            if len(self._name_cache) < 10_000:
                self._name_cache[raw] = checked
        return checked

    def _dynamic_groups(
        self, view: RecordView, candidates: np.ndarray, matched: np.ndarray, routes: Routes
    ) -> dict[str, np.ndarray]:
        """Positions per dynamic table; rejected names become dead letters; ``matched`` is updated."""
        assert self.dynamic is not None
        groups: dict[str, list[np.ndarray]] = {}
        array = self.dynamic.array(view, candidates) if self.vectorised else None
        if array is not None:
            # Vectorised: validate each distinct name once, then group positions by name.
            encoded = array.dictionary_encode()
            codes = np.asarray(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            for code, raw in enumerate(encoded.dictionary.to_pylist()):
                positions = candidates[codes == code]
                matched[positions] = True
                table, reason = self._check_name(raw)
                if table is None:
                    message = reason or "rejected dynamic table name"
                    routes.dead.extend((int(p), message) for p in positions)
                else:
                    groups.setdefault(table, []).append(positions)
        else:
            for pos, raw in zip(
                candidates.tolist(), self.dynamic.names(view, candidates, False), strict=True
            ):
                if raw is None:
                    continue
                matched[pos] = True
                table, reason = self._check_name(raw)
                if table is None:
                    routes.dead.append((pos, reason or "rejected dynamic table name"))
                else:
                    groups.setdefault(table, []).append(np.asarray([pos], dtype=np.int64))
        return {table: np.sort(np.concatenate(parts)) for table, parts in groups.items()}

    def route(self, view: RecordView) -> Routes:
        n = len(view)
        routes = Routes()
        matched = np.zeros(n, dtype=bool)
        indexed, answered = self._indexed(view) if self.vectorised else ({}, set())
        for name, predicate in self.rules.items():
            if name in answered:
                if name not in indexed:
                    continue  # no record has its value
                mask = indexed[name]
            elif predicate is None:
                mask = np.ones(n, dtype=bool)
            else:
                matches = predicate.evaluate(view, self.vectorised)
                mask = matches.mask
                for pos, problem in matches.failed:
                    routes.failed.append((pos, name, f"when {predicate.expression!r} failed: {problem}"))
                    matched[pos] = True
            if mask.any():
                routes.tables[name] = np.flatnonzero(mask)
                matched |= mask
        if self.dynamic is not None and self.config.dynamic is not None:
            applies_all = self.config.dynamic.applies_to == "all"
            candidates = np.arange(n) if applies_all else np.flatnonzero(~matched)
            if len(candidates):
                groups = self._dynamic_groups(view, candidates, matched, routes)
                for table, positions in groups.items():
                    known = routes.tables.get(table)
                    routes.tables[table] = positions if known is None else np.union1d(known, positions)
        unmatched = np.flatnonzero(~matched)
        if len(unmatched):
            action = self.config.unmatched.action
            if action == "drop":
                routes.dropped = len(unmatched)
            elif action == "dead-letter":
                routes.dead.extend((int(p), UNMATCHED_REASON) for p in unmatched)
            else:
                assert self.default_table is not None
                routes.tables[self.default_table] = unmatched
        routes.dead.sort()
        return routes
