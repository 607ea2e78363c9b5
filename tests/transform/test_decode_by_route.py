"""Mixed-type JSON topics stay vectorised: routing fields first, then each table's records.

The demo's ``orders`` topic carries ``amount`` as a string on orders and as a number on payments
(and ``ts`` as ISO text and epoch milliseconds): the batch is no single Arrow table. These tests
forbid the per-record path (``JsonDecoder._parse_each``, Python objects of the records) and count
``parse_json_value`` calls, so they fail if a mixed batch falls back to json.loads per record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.common import embedded_catalog_settings
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.devtools.sample_data import shop_events
from fanout_sink.transform import deadletter
from fanout_sink.transform.formats import json as json_format
from fanout_sink.transform.formats.decoded import Decoded
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.records import RoutedSlice

DEMO = Path(__file__).resolve().parents[2] / "routing" / "shop-demo.yaml"
BY_TYPE = frozenset({("type",)})


def _orders_topic(count: int) -> list[bytes]:
    """The demo's ``orders`` topic: orders (string amount, ISO ts) and payments (numbers)."""
    return [e.value for e in shop_events(count) if e.topic == "orders"]


@pytest.fixture
def parsed_alone(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Forbids the per-record path; returns the values ``parse_json_value`` was called with."""

    def forbidden(*args: Any) -> Any:
        raise AssertionError("the per-record path was taken")

    monkeypatch.setattr(JsonDecoder, "_parse_each", staticmethod(forbidden))
    monkeypatch.setattr(Decoded, "python", forbidden)
    calls: list[bytes] = []
    real: Callable[[bytes | None], Any] = json_format.parse_json_value

    def counted(value: bytes | None) -> Any:
        calls.append(value or b"")
        return real(value)

    monkeypatch.setattr(json_format, "parse_json_value", counted)
    return calls


def test_mixed_batch_decodes_routing_fields_then_each_group_in_one_call(parsed_alone: list[bytes]) -> None:
    values = _orders_topic(2000)
    decoded = JsonDecoder()(pa.array(values), BY_TYPE)
    assert decoded.failures == [] and decoded.rows.tolist() == list(range(len(values)))
    assert decoded.routed == frozenset({"type"}) and decoded.records.column_names == ["type"]
    kinds = np.asarray(decoded.records.column("type").to_pylist())
    orders = decoded.subset(np.flatnonzero(kinds == "order"), "shop.orders")
    payments = decoded.subset(np.flatnonzero(kinds == "payment"), "shop.payments")
    assert orders.records.schema.field("amount").type == pa.string()
    assert orders.records.schema.field("ts").type == pa.string()  # ISO text stays text
    assert payments.records.schema.field("amount").type == pa.float64()
    assert payments.records.schema.field("ts").type == pa.int64()
    assert orders.lossy == payments.lossy == frozenset()
    expected = [json.loads(values[i])["amount"] for i in orders.rows.tolist()]
    assert orders.records.column("amount").to_pylist() == expected
    # Only the sample that types the routing fields was parsed value by value.
    assert 0 < len(parsed_alone) <= json_format.SAMPLE


def test_without_routing_fields_a_mixed_batch_still_goes_per_record(parsed_alone: list[bytes]) -> None:
    """The guard above can fail: the same batch without ``fields`` takes the per-record path."""
    with pytest.raises(AssertionError, match="per-record path"):
        JsonDecoder()(pa.array(_orders_topic(200)))


def test_a_routing_field_that_changes_type_is_decoded_per_record() -> None:
    values = pa.array([b'{"v": 1, "w": "a"}', b'{"v": "one", "w": 2}'])
    decoded = JsonDecoder()(values, frozenset({("v",)}))
    assert decoded.routed is None and decoded.lossy == frozenset({"v", "w"})
    assert decoded.python() == [{"v": 1, "w": "a"}, {"v": "one", "w": 2}]


def _demo_processor(catalog_settings: CatalogSettings, catalog: Any) -> Any:
    config = load_config(DEMO).model_copy(update={"catalog": catalog_settings})
    return build_processor(config, catalog)


def test_demo_orders_topic_lands_in_each_tables_types(
    catalog_settings: CatalogSettings, catalog: Any, parsed_alone: list[bytes]
) -> None:
    values = _orders_topic(1500)
    process = _demo_processor(catalog_settings, catalog)
    out = process(make_raw_slice(values, topic="orders"))
    assert out.dead_letters == [] and out.filtered == 0
    sent = [json.loads(v) for v in values]
    orders = out.tables["shop.orders"].rows
    payments = out.tables["shop.payments"].rows
    assert orders.num_rows + payments.num_rows == len(values)
    # orders: the string amount becomes the declared decimal(12, 2), the ISO ts a timestamp
    assert orders.schema.field("amount").type == pa.decimal128(12, 2)
    assert pa.types.is_timestamp(orders.schema.field("ts").type)
    expected = {r["id"]: Decimal(r["amount"]) for r in sent if r["type"] == "order"}
    assert (
        dict(zip(orders.column("id").to_pylist(), orders.column("amount").to_pylist(), strict=True))
        == expected
    )
    # payments (schema inferred from the first rows): numbers stay numbers, epoch-ms ts a timestamp
    assert payments.schema.field("amount").type == pa.float64()
    assert payments.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    expected_payments = {r["id"]: (r["amount"], r["ts"]) for r in sent if r["type"] == "payment"}
    got = zip(
        payments.column("id").to_pylist(),
        payments.column("amount").to_pylist(),
        (us // 1000 for us in payments.column("ts").cast(pa.int64()).to_pylist()),
        strict=True,
    )
    assert {i: (a, t) for i, a, t in got} == expected_payments
    assert len(parsed_alone) <= json_format.SAMPLE


def test_bad_values_in_a_mixed_batch_become_dead_letters_the_rest_stays_vectorised(
    catalog_settings: CatalogSettings, catalog: Any, parsed_alone: list[bytes]
) -> None:
    values = _orders_topic(3000)
    truncated, nan = 700, 1500
    values[truncated] = b'{"type": "order", "id": "order-bad", "amount": "1.00"'
    values[nan] = b'{"type": "payment", "id": "payment-bad", "amount": NaN, "ts": 1}'
    process = _demo_processor(catalog_settings, catalog)
    out = process(make_raw_slice(values, topic="orders", partition=3, start_offset=10_000))
    letters = {
        deadletter.header(d, deadletter.SOURCE_OFFSET): (
            deadletter.header(d, deadletter.STAGE),
            deadletter.header(d, deadletter.REASON),
            deadletter.header(d, deadletter.SOURCE_TOPIC),
            deadletter.header(d, deadletter.SOURCE_PARTITION),
        )
        for d in out.dead_letters
    }
    assert set(letters) == {str(10_000 + truncated), str(10_000 + nan)}
    stage, reason, topic, partition = letters[str(10_000 + truncated)]
    assert (stage, topic, partition) == ("decode", "orders", "3") and reason is not None
    assert reason.startswith("invalid JSON")
    assert letters[str(10_000 + nan)][1] is not None
    assert letters[str(10_000 + nan)][1].startswith("invalid JSON: NaN is not a JSON value")
    rows = sum(t.rows.num_rows for t in out.tables.values())
    assert rows == len(values) - 2 and process.last_stats.reconciles()
    # The NaN was screened out before parsing; the truncated value was found by halving the
    # batch: a few small groups parsed one value at a time, not the batch.
    assert len(parsed_alone) <= json_format.SAMPLE + 2 * json_format.LEAF


def test_a_table_within_another_tables_records_is_taken_from_its_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Orders and big orders: the big orders' values are not parsed a second time."""
    decoded = JsonDecoder()(pa.array(_orders_topic(600)), BY_TYPE)
    kinds = np.asarray(decoded.records.column("type").to_pylist())
    orders = np.flatnonzero(kinds == "order")
    all_orders = decoded.subset(orders, "shop.orders")
    reads: list[int] = []
    real = json_format.arrow_read

    def counted(*args: Any) -> pa.Table:
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(json_format, "arrow_read", counted)
    some = decoded.subset(orders[::3], "shop.big_orders")
    assert reads == []
    assert some.rows.tolist() == orders[::3].tolist()
    assert some.records.equals(all_orders.records.take(pa.array(np.arange(0, len(orders), 3))))
    decoded.subset(np.flatnonzero(kinds == "payment"), "shop.payments")
    assert reads == [1]


def test_routing_field_types_come_from_values_spread_over_the_batch(parsed_alone: list[bytes]) -> None:
    """Kinds come in runs: a field only the batch's second half sets is still typed right."""
    orders = [json.dumps({"type": "order", "amount": "1.50"}).encode()] * 200
    payments = [json.dumps({"type": "payment", "amount": 2.5, "n": i}).encode() for i in range(200)]
    decoded = JsonDecoder()(pa.array(orders + payments), frozenset({("type",), ("n",)}))
    assert decoded.routed == frozenset({"type", "n"})
    assert decoded.records.schema.field("n").type == pa.int64()
    assert decoded.records.column("n").to_pylist() == [None] * 200 + list(range(200))


_amounts = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from(["12.50", "x"]),
)
_times = st.one_of(
    st.none(), st.integers(0, 2**41), st.sampled_from(["2024-05-01T10:00:00Z", "2024-05-01", "?"])
)
_shop_records = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["order", "payment", "click", "refund"]),
        "id": st.text(max_size=4),
        "method": st.sampled_from(["card", "sepa"]),
    },
    optional={
        "amount": _amounts,
        "ts": _times,
        "customer": st.one_of(
            st.none(), st.fixed_dictionaries({"id": st.integers(0, 9), "country": st.just("DE")})
        ),
        "items": st.lists(
            st.fixed_dictionaries({"sku": st.just("A"), "qty": st.integers(1, 3), "price": st.floats(0, 9)}),
            max_size=2,
        ),
    },
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    records=st.lists(_shop_records, min_size=1, max_size=25),
    bad=st.sampled_from([None, b"{oops", b'{"type": NaN}']),
)
def test_decoding_by_route_lands_what_the_per_record_path_lands(
    tmp_path_factory: pytest.TempPathFactory, records: list[dict[str, Any]], bad: bytes | None
) -> None:
    """The demo's routing over records whose fields change type by kind: the same rows and dead
    letters as json.loads per record (both convert into the same tables).

    Each example gets a catalog of its own: tables an earlier example created would decide the
    column types (and the key order of JSON-text columns) of this one, so the outcome would depend
    on the order hypothesis draws examples in."""
    catalog_settings = embedded_catalog_settings(tmp_path_factory.mktemp("example"))
    catalog = load_catalog(catalog_settings)
    values = [json.dumps(r).encode() for r in records] + ([bad] if bad else [])
    raw = make_raw_slice(values, topic="orders")
    config = load_config(DEMO).model_copy(update={"catalog": catalog_settings})
    by_route = build_processor(config, catalog)(raw)
    reference = RoutingProcessor(config, catalog, decoder=JsonDecoder(per_record=True))(raw)
    assert _landed(by_route) == _landed(reference)


def _landed(out: RoutedSlice) -> tuple[Any, ...]:
    tables = {name: rows.rows.to_pylist() for name, rows in sorted(out.tables.items())}
    return tables, [(d.key, d.value, d.headers) for d in out.dead_letters], out.filtered
