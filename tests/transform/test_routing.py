"""Routing: vectorised predicates agree with jmespath, projections, dynamic names, unmatched policy."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.raw_slices import make_raw_slice

from fanout_sink.config.loading import parse_config
from fanout_sink.transform.expressions import Matches, NameExpression, Predicate, Projection
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.record_view import RecordView
from fanout_sink.transform.routing import UNMATCHED_REASON, NameRules, Router, normalise_table_name


def _view(records: list[dict[str, Any]], **slice_args: Any) -> RecordView:
    raw = make_raw_slice([json.dumps(r).encode() for r in records], **slice_args)
    decoded = JsonDecoder()(raw.column("value").combine_chunks())
    assert decoded.failures == []
    return RecordView.build(decoded, raw)


RECORDS = [
    {"type": "order", "id": 1, "amount": 12.5, "ok": True, "customer": {"id": "c1", "tier": "gold"}},
    {"type": "payment", "id": 2, "amount": 3, "ok": False, "customer": {"id": "c2"}},
    {"type": "refund", "id": 3, "customer": None},
    {"type": "order", "id": 4, "amount": None, "ok": None, "note": "rush"},
]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("type == 'order'", [True, False, False, True]),
        ("type != 'order'", [False, True, True, False]),
        ("amount > `5`", [True, False, False, False]),
        ("id >= `2` && id < `4`", [False, True, True, False]),
        ("contains(['payment', 'refund'], type)", [False, True, True, False]),
        ("regex(type, '^(or|pa)')", [True, True, False, True]),
        ("starts_with(customer.id, 'c')", [True, True, False, False]),
        ("customer.tier == 'gold'", [True, False, False, False]),
        ("ok", [True, False, False, False]),
        ("!ok", [False, True, True, True]),
        ("note == `null`", [True, True, True, False]),
        ("topic == 'orders'", [True, True, True, True]),
        ("offset >= `2`", [False, False, True, True]),
        ("_kafka.partition == `3`", [True, True, True, True]),
        ("key == 'k1'", [False, True, False, False]),
    ],
)
def test_simple_predicates_are_vectorised(expression: str, expected: list[bool]) -> None:
    view = _view(RECORDS, topic="orders", partition=3, keys=[b"k0", b"k1", None, b"\xff"])
    predicate = Predicate(expression)
    fast = predicate.evaluate(view)
    assert fast.mask.tolist() == expected
    assert predicate.last_vectorised, expression
    slow = predicate.evaluate(view, vectorised=False)
    assert slow.mask.tolist() == expected
    assert fast.failed == slow.failed


@pytest.mark.parametrize(
    "expression",
    ["headers.source == 'web'", "length(type) > `5`", "customer.id == type", "amount == '12.5'"],
)
def test_other_predicates_fall_back_to_jmespath(expression: str) -> None:
    view = _view(RECORDS, headers=[[("source", b"web")], [], None, [("source", b"app")]])
    predicate = Predicate(expression)
    mask = predicate.evaluate(view).mask
    assert not predicate.last_vectorised
    assert mask.tolist() == predicate.evaluate(view, vectorised=False).mask.tolist()


def test_headers_and_metadata_visible_per_record() -> None:
    view = _view(RECORDS, headers=[[("source", b"web")], [], None, [("source", b"app")]])
    assert Predicate("headers.source == 'web'").evaluate(view).mask.tolist() == [True, False, False, False]
    shadow = _view([{"topic": "mine"}, {"x": 1}], topic="orders")
    assert Predicate("topic == 'mine'").evaluate(shadow).mask.tolist() == [True, False]
    assert Predicate("_kafka.topic == 'orders'").evaluate(shadow).mask.tolist() == [True, True]


@pytest.mark.parametrize("vectorised", [True, False])
def test_a_predicate_that_raises_on_a_record_names_it_and_why(vectorised: bool) -> None:
    """Issue 47 item 5: a record a ``when`` raised on was "no match"; it is named with jmespath's
    reason now, on both paths alike, and the records it did not raise on are answered as before."""
    matches = Predicate("starts_with(customer.id, 'c')").evaluate(_view(RECORDS), vectorised)
    assert matches.mask.tolist() == [True, True, False, False]
    assert [pos for pos, _ in matches.failed] == [2, 3]
    assert all("starts_with()" in reason and "invalid type" in reason for _, reason in matches.failed)


# --- property: the vectorised path and the jmespath path agree ---------------------------------

_ATOMS = [
    "s == 'a'",
    "s != 'b'",
    "s < 'b'",
    "n > `1`",
    "n <= `2.5`",
    "n == `1`",
    "n != `0`",
    "contains(['a', 'b'], s)",
    "contains(`[1, 2]`, n)",
    "regex(s, '^a')",
    "starts_with(s, 'a')",
    "ends_with(s, 'c')",
    "contains(s, 'b')",
    "b",
    "s",
    "n",
    "nested.x == 'a'",
    "nested.x",
    "s == `null`",
    "topic == 'orders'",
    "offset >= `3`",
    "key == 'k1'",
    "missing == 'a'",
    "missing != 'a'",
]

_predicates = st.recursive(
    st.sampled_from(_ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda p: f"({p[0]}) && ({p[1]})"),
        st.tuples(inner, inner).map(lambda p: f"({p[0]}) || ({p[1]})"),
        inner.map(lambda p: f"!({p})"),
    ),
    max_leaves=4,
)

_MISSING = object()
_strings = st.sampled_from(["a", "b", "abc", "", "bc", "ba"])
_numbers = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 1.0, 2.5, -1.5]))


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(values, st.none(), st.just(_MISSING))


_records = st.fixed_dictionaries(
    {
        "s": _maybe(_strings),
        "n": _maybe(_numbers),
        "b": _maybe(st.booleans()),
        "nested": _maybe(st.fixed_dictionaries({"x": _maybe(_strings)})),
    }
).map(lambda r: _strip(r))


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not _MISSING}
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    predicate=_predicates,
    records=st.lists(_records, min_size=1, max_size=12),
    mixed=st.booleans(),
)
def test_vectorised_and_jmespath_agree(predicate: str, records: list[dict[str, Any]], mixed: bool) -> None:
    if mixed:  # one field changes type within the batch: that column is evaluated per record
        records = [*records, {"s": 5}]
    keys = [f"k{i % 3}".encode() for i in range(len(records))]
    view = _view(records, topic="orders", keys=keys)
    compiled = Predicate(predicate)
    fast = compiled.evaluate(view)
    slow = compiled.evaluate(view, vectorised=False)
    assert fast.mask.tolist() == slow.mask.tolist(), predicate
    assert fast.failed == slow.failed, predicate


# --- projections and names ---------------------------------------------------------------------


def test_projection_vectorised_matches_per_record() -> None:
    view = _view(RECORDS, topic="orders")
    projection = Projection("{id: id, customer: customer.id, total: amount, src: topic}")
    positions = np.arange(len(RECORDS))
    fast, kept, failures = projection.apply(view, positions)
    assert projection.last_vectorised and failures == [] and kept.tolist() == [0, 1, 2, 3]
    slow, _, _ = projection.apply(view, positions, vectorised=False)
    assert fast.to_pylist() == slow.to_pylist()
    assert fast.to_pylist()[0] == {"id": 1, "customer": "c1", "total": 12.5, "src": "orders"}


def test_projection_that_is_not_an_object_fails_the_record() -> None:
    view = _view(RECORDS)
    rows, kept, failures = Projection("customer").apply(view, np.arange(len(RECORDS)))
    assert kept.tolist() == [0, 1]
    assert [p for p, _ in failures] == [2, 3]
    assert "not an object" in failures[0][1]
    assert rows.column("id").to_pylist() == ["c1", "c2"]


def test_dynamic_name_expression_vectorised() -> None:
    view = _view([{"a": 1}, {"a": 2}], topic="Orders-EU")
    names = NameExpression("join('.', ['raw', topic])")
    assert names.names(view, np.arange(2)) == ["raw.Orders-EU", "raw.Orders-EU"]
    assert names.last_vectorised


RULES = NameRules(allow=r"^raw\.[a-z0-9_]+$", max_namespace_depth=1, max_name_length=40)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("raw.orders", "raw.orders"),
        ("RAW.Orders-EU", "raw.orders_eu"),
    ],
)
def test_dynamic_names_normalised(raw: str, expected: str) -> None:
    assert normalise_table_name(raw, RULES) == (expected, None)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("raw/../etc", "path separator"),
        ("raw\\x", "path separator"),
        ("raw..orders", "empty part"),
        (".raw.orders", "empty part"),
        ("raw.ord\x00ers", "control characters"),
        ("raw.ord\ners", "control characters"),
        ("system.users", "does not match dynamic.allow"),
        ("raw.a.b", "namespaces deep"),
        ("orders", "no namespace"),
        ("raw." + "x" * 60, "characters long"),
        ("raw.ord$rs", "may hold only"),
        ("raw.1x", "may hold only"),
        (42, "not a string"),
    ],
)
def test_hostile_dynamic_names_rejected(raw: Any, reason: str) -> None:
    name, why = normalise_table_name(raw, RULES)
    assert name is None
    assert why is not None and reason in why


def _config(**overrides: Any) -> Any:
    data: dict[str, Any] = {
        "name": "shop",
        "source": {"topics": ["orders"]},
        "tables": {
            "analytics.orders": {"when": "type == 'order'"},
            "analytics.big": {"when": "id > `2`"},
        },
        "dead-letter": {"topic": "dlq"},
    }
    data.update(overrides)
    return parse_config(data, "test")


def test_router_multi_route_and_drop() -> None:
    routes = Router(_config()).route(_view(RECORDS))
    assert routes.tables["analytics.orders"].tolist() == [0, 3]
    assert routes.tables["analytics.big"].tolist() == [2, 3]
    assert routes.dropped == 1 and routes.dead == []


def test_router_unmatched_to_dead_letter_and_default_table() -> None:
    routes = Router(_config(unmatched={"action": "dead-letter"})).route(_view(RECORDS))
    assert routes.dead == [(1, UNMATCHED_REASON)]
    config = _config(
        tables={"analytics.orders": {"when": "type == 'order'"}, "analytics.other": {}},
        unmatched={"action": "table", "table": "analytics.other"},
    )
    routes = Router(config).route(_view(RECORDS))
    assert routes.tables["analytics.other"].tolist() == [1, 2]


def test_router_dynamic_with_hostile_names() -> None:
    config = _config(
        tables={"analytics.orders": {"when": "type == 'order'"}},
        dynamic={"table": "join('.', ['raw', type])", "allow": r"^raw\.[a-z0-9_]+$"},
    )
    records = [{"type": "order"}, {"type": "click"}, {"type": "../../etc"}, {"id": 1}]
    routes = Router(config).route(_view(records))
    assert routes.tables == {"analytics.orders": [0], "raw.click": [1]} or (
        routes.tables["analytics.orders"].tolist() == [0] and routes.tables["raw.click"].tolist() == [1]
    )
    assert [p for p, _ in routes.dead] == [2]
    assert "path separator" in routes.dead[0][1]
    assert routes.dropped == 1  # no type: the name expression fails, the record is unmatched


_kind_values = st.one_of(
    st.sampled_from(["click", "View", "sign-up", "../x", "a.b", "x\ty", "", "UPPER_case"]),
    st.none(),
    st.just(_MISSING),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(_kind_values, min_size=1, max_size=15),
    applies_to=st.sampled_from(["unmatched", "all"]),
    numeric=st.booleans(),
)
def test_dynamic_routing_vectorised_and_per_record_agree(
    kinds: list[Any], applies_to: str, numeric: bool
) -> None:
    records = [_strip({"type": "order" if i % 3 == 0 else "x", "kind": k}) for i, k in enumerate(kinds)]
    if numeric:
        records.append({"kind": 5})  # a number: the name column is no longer all strings
    config = _config(
        tables={"analytics.orders": {"when": "type == 'order'"}},
        dynamic={"table": "join('.', ['raw', kind])", "allow": r"^raw\.[a-z_]+$", "applies-to": applies_to},
        unmatched={"action": "dead-letter"},
    )
    view = _view(records)
    fast = Router(config).route(view)
    slow = Router(config, vectorised=False).route(view)
    assert {k: v.tolist() for k, v in fast.tables.items()} == {k: v.tolist() for k, v in slow.tables.items()}
    assert fast.dead == slow.dead and fast.dropped == slow.dropped


# --- many tables routed by one field ------------------------------------------------------------


def _wide_config(tables: int, **overrides: Any) -> Any:
    rules = {f"w.t{n:03d}": {"when": f"t == 't{n:03d}'"} for n in range(tables)}
    rules["w.reversed"] = {"when": "'t001' == t"}  # either way round
    rules["w.nested"] = {"when": "c.x == 'a'"}  # alone on its path: its own mask
    return _config(tables=rules, unmatched={"action": "dead-letter"}, **overrides)


def test_many_tables_routed_by_one_field_cost_one_look_at_it_not_one_per_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    masks: list[str] = []
    own_evaluate = Predicate.evaluate

    def counted(self: Predicate, view: RecordView, vectorised: bool = True) -> Matches:
        masks.append(self.expression)
        return own_evaluate(self, view, vectorised)

    monkeypatch.setattr(Predicate, "evaluate", counted)
    records = [{"t": f"t{n % 7:03d}", "c": {"x": "a" if n % 2 else "b"}} for n in range(40)] + [{"id": 1}]
    routes = Router(_wide_config(500)).route(_view(records))
    # Before: one mask per configured table (502), whichever tables the slice's records go to.
    assert masks == ["c.x == 'a'"]
    assert set(routes.tables) == {f"w.t{n:03d}" for n in range(7)} | {"w.reversed", "w.nested"}
    assert routes.tables["w.t003"].tolist() == list(range(3, 40, 7))
    assert routes.tables["w.reversed"].tolist() == routes.tables["w.t001"].tolist()
    assert routes.dead == [(40, UNMATCHED_REASON)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(
        st.one_of(st.sampled_from(["t000", "t001", "t002", "T001", ""]), st.none(), st.just(_MISSING)),
        min_size=1,
        max_size=15,
    ),
    other=st.sampled_from([None, 5, "t002", {"x": 1}]),
)
def test_indexed_equalities_and_per_record_routing_agree(values: list[Any], other: Any) -> None:
    records = [_strip({"t": v, "c": {"x": "a"}}) for v in values]
    if other is not None:
        records.append({"t": other})  # another type in the batch: the column is not all strings
    view = _view(records)
    config = _wide_config(3)
    fast = Router(config).route(view)
    slow = Router(config, vectorised=False).route(view)
    assert {k: v.tolist() for k, v in fast.tables.items()} == {k: v.tolist() for k, v in slow.tables.items()}
    assert fast.dead == slow.dead and fast.dropped == slow.dropped


def test_a_view_takes_each_tables_records_from_one_chunk() -> None:
    """pyarrow.json gives a chunk per MB-sized block (11 for 50,000 records), and Arrow's ``take`` on
    a chunked table pays for the whole table on each call: with a subset per table and 500 tables,
    most of routing (issue 34). The view makes the records one chunk once; each subset is exact."""
    records = [{"id": n, "kind": f"k{n % 3}"} for n in range(30)]
    raw = make_raw_slice([json.dumps(r).encode() for r in records])
    decoded = JsonDecoder()(raw.column("value").combine_chunks())
    chunked = pa.Table.from_batches(decoded.records.to_batches(max_chunksize=7))
    assert chunked.column("id").num_chunks == 5
    view = RecordView.build(replace(decoded, records=chunked), raw)

    assert [column.num_chunks for column in view.records.columns] == [1, 1]
    for kind in range(3):
        sub = view.subset(np.arange(kind, 30, 3), f"t{kind}")
        assert sub.records.to_pylist() == records[kind::3]
        assert sub.meta.column("offset").to_pylist() == list(range(kind, 30, 3))
