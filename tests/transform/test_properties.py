"""Hypothesis properties of decode, route and convert over arbitrary (mostly hostile) input.

* any bytes: the JSON decoder never raises; each value decodes or fails with a reason, and the
  batch path and the per-record path agree on which;
* any JSON records through the corpus sink: every record has exactly one outcome (a row, a dead
  letter or filtered), and the vectorised and per-record routing paths give the same slice;
* conversion never lets a row through with a null in a required column;
* a dynamic name that is accepted is a valid Iceberg identifier allowed by ``dynamic.allow``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bad_records import REPO, sink_settings
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.transform.convert import convert
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.processor import build_processor
from fanout_sink.transform.records import RoutedSlice
from fanout_sink.transform.routing import NameRules, normalise_table_name

_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_field_names = st.sampled_from(["type", "id", "ts", "amount", "table", "customer", "x"])
_records = st.dictionaries(_field_names, _json_values | st.sampled_from(["order", "raw.click", "2024-05-01"]))


def _mutate(data: bytes, where: int, byte: int, cut: bool) -> bytes:
    """A valid value broken the way networks and buggy producers break them."""
    if not data:
        return bytes([byte])
    where %= len(data)
    return data[:where] if cut else data[:where] + bytes([byte]) + data[where + 1 :]


_values = st.one_of(
    st.binary(max_size=40),
    _records.map(lambda r: json.dumps(r).encode()),
    st.builds(
        _mutate,
        _records.map(lambda r: json.dumps(r).encode()),
        st.integers(0, 200),
        st.integers(0, 255),
        st.booleans(),
    ),
    _json_values.map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(_values, min_size=1, max_size=12))
def test_any_bytes_decode_or_fail_with_a_reason(values: list[bytes]) -> None:
    array = pa.array(values, pa.binary())
    batch = JsonDecoder()(array)
    single = JsonDecoder(per_record=True)(array)
    for decoded in (batch, single):
        failed = [i for i, _ in decoded.failures]
        assert sorted(decoded.rows.tolist() + failed) == list(range(len(values)))
        assert all(reason for _, reason in decoded.failures)
        assert decoded.records.num_rows == len(decoded.rows) == len(decoded.python())
    assert batch.rows.tolist() == single.rows.tolist()
    assert batch.python() == single.python()


def _config(catalog_settings: CatalogSettings) -> Any:
    data = {"name": "props", "catalog": catalog_settings.model_dump(), **sink_settings()}
    return parse_config(data, "props", base_dir=REPO)


def _summary(out: RoutedSlice) -> tuple[Any, ...]:
    tables = {name: rows.rows.to_pylist() for name, rows in sorted(out.tables.items())}
    return tables, [(d.key, d.value, d.headers) for d in out.dead_letters], out.filtered


@settings(max_examples=25, deadline=None, suppress_health_check=_FIXTURES)
@given(values=st.lists(_values | st.none(), min_size=1, max_size=15))
def test_each_record_has_exactly_one_outcome_and_both_paths_agree(
    catalog_settings: CatalogSettings, values: list[bytes | None]
) -> None:
    """The corpus sink routes a record to at most one table, so rows + dead letters + filtered = records."""
    config = _config(catalog_settings)
    catalog = load_catalog(catalog_settings)
    raw = make_raw_slice(values)
    fast = build_processor(config, catalog)
    out = fast(raw)
    rows = sum(t.rows.num_rows for t in out.tables.values())
    assert rows + len(out.dead_letters) + out.filtered == len(values)
    assert fast.last_stats.reconciles() and fast.last_stats.extra_routes == 0
    for name, table_rows in out.tables.items():
        assert table_rows.rows.schema.equals(table_rows.table.schema().as_arrow()), name
    slow = build_processor(config, catalog, vectorised=False)
    assert _summary(slow(raw)) == _summary(out)


ORDERS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("total", pa.decimal128(12, 2)),
        pa.field(
            "items", pa.list_(pa.field("element", pa.struct([pa.field("sku", pa.string(), False)]), False))
        ),
    ]
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_records, min_size=1, max_size=12))
def test_conversion_never_lets_a_required_null_through(records: list[dict[str, Any]]) -> None:
    decoded = JsonDecoder()(pa.array([json.dumps(r).encode() for r in records], pa.binary()))
    converted = convert(decoded.records, ORDERS_SCHEMA)
    assert converted.rows.num_rows + len(converted.failures) == decoded.records.num_rows
    assert converted.rows.schema.equals(ORDERS_SCHEMA)
    assert converted.rows.column("id").null_count == 0 and converted.rows.column("ts").null_count == 0
    items = converted.rows.column("items").combine_chunks()
    assert items.flatten().null_count == 0
    assert pa.compute.struct_field(items.flatten(), "sku").null_count == 0


_name_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["raw", "Raw", "a-b", "x", "_", "", "1a", "é", " "]), max_size=4).map(".".join),
)
_PART = re.compile(r"[a-z_][a-z0-9_]*")


@settings(max_examples=300, deadline=None)
@given(raw=_name_text | _json_values, depth=st.integers(1, 3), length=st.integers(5, 60))
def test_accepted_dynamic_names_are_valid_iceberg_identifiers(raw: Any, depth: int, length: int) -> None:
    allow = r"^raw(\.[a-z0-9_]+)+$"
    name, reason = normalise_table_name(raw, NameRules(allow, depth, length))
    assert (name is None) != (reason is None)
    if name is None:
        return
    parts = name.split(".")
    assert all(_PART.fullmatch(part) for part in parts), name
    assert 2 <= len(parts) <= depth + 1 and len(name) <= length
    assert re.fullmatch(allow, name)
