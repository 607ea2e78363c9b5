"""Inferred schemas: each table gets only the fields its own records carry; the timestamp rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import LongType, StringType, TimestampType, TimestamptzType
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.transform import deadletter
from fanout_sink.transform.inference import Inference, time_named, timestamp_type
from fanout_sink.transform.processor import build_processor

REPO = Path(__file__).resolve().parents[2]
_TZ = pa.timestamp("us", tz="UTC")
_ORDER = {"type": "order", "id": "o-1", "customer": {"id": 7, "tier": "gold"}, "currency": "EUR", "n": 1}
_PAYMENT = {"type": "payment", "id": "p-1", "method": "card", "n": 2}


def _config(catalog_settings: CatalogSettings, **overrides: Any) -> SinkConfig:
    data: dict[str, Any] = {
        "name": "shop",
        "source": {"topics": ["events"]},
        "catalog": catalog_settings.model_dump(),
        "tables": {
            "shop.orders": {"when": "type == 'order'"},
            "shop.payments": {"when": "type == 'payment'"},
        },
        "dead-letter": {"topic": "dlq"},
    }
    data.update(overrides)
    return parse_config(data, "test", base_dir=REPO)


def _slice(records: list[dict[str, Any]], start: int = 0) -> pa.Table:
    return make_raw_slice([json.dumps(r).encode() for r in records], start_offset=start)


def _columns(catalog: Any, name: str) -> dict[str, str]:
    return {f.name: str(f.field_type) for f in catalog.load_table(name).schema().fields}


# --------------------------------------------------------------------------------------------
# Only the table's own fields


@pytest.mark.parametrize("evolution", [False, True])
def test_two_routes_of_one_batch_each_get_only_their_fields(
    catalog_settings: CatalogSettings, catalog: Any, evolution: bool
) -> None:
    """The batch's field types agree, so it is parsed in one Arrow call and every row has every
    field; each table must still be created with its own records' fields only."""
    tables = {
        "shop.orders": {"when": "type == 'order'", "evolution": evolution},
        "shop.payments": {"when": "type == 'payment'", "evolution": evolution},
    }
    process = build_processor(_config(catalog_settings, tables=tables), catalog)
    out = process(_slice([_ORDER, _PAYMENT, _ORDER]))
    assert out.dead_letters == []
    assert _columns(catalog, "shop.payments") == {
        "type": "string",
        "id": "string",
        "method": "string",
        "n": "long",
    }
    orders = _columns(catalog, "shop.orders")
    assert set(orders) == {"type", "id", "customer", "currency", "n"}
    assert set(out.tables["shop.payments"].rows.column_names) == {"type", "id", "method", "n"}


def test_a_field_the_records_carry_as_null_is_kept_without_evolution(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """Present but null in every first row, in a table that cannot add columns later: kept (as
    a string, there being no value to type it), unlike another route's field."""
    process = build_processor(_config(catalog_settings), catalog)
    process(_slice([_ORDER, {**_PAYMENT, "coupon": None}]))
    payments = _columns(catalog, "shop.payments")
    assert payments["coupon"] == "string" and "customer" not in payments and "currency" not in payments


def test_struct_children_of_other_routes_are_left_out(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    payment = {**_PAYMENT, "customer": {"id": 9}}
    process = build_processor(_config(catalog_settings), catalog)
    process(_slice([_ORDER, payment]))
    customer = catalog.load_table("shop.payments").schema().find_field("customer")
    assert [f.name for f in customer.field_type.fields] == ["id"]


def test_evolution_adds_a_column_only_when_the_tables_rows_carry_a_value(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    tables = {
        "shop.orders": {"when": "type == 'order'"},
        "shop.payments": {"when": "type == 'payment'", "evolution": True},
    }
    process = build_processor(_config(catalog_settings, tables=tables), catalog)
    process(_slice([_PAYMENT]))
    process(_slice([_ORDER, _PAYMENT], start=1))  # payments rows now have customer, currency: null
    assert list(_columns(catalog, "shop.payments")) == ["type", "id", "method", "n"]
    process(_slice([_ORDER, {**_PAYMENT, "currency": "EUR"}], start=3))
    assert list(_columns(catalog, "shop.payments")) == ["type", "id", "method", "n", "currency"]


def test_dynamic_and_unmatched_tables_get_only_their_fields(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    config = _config(
        catalog_settings,
        tables={"shop.orders": {"when": "type == 'order'"}, "shop.other": {}},
        dynamic={"table": "join('.', ['raw', kind])", "allow": r"^raw\.[a-z]+$", "auto-create": True},
        unmatched={"action": "table", "table": "shop.other"},
    )
    process = build_processor(config, catalog)
    click = {"type": "event", "kind": "click", "id": "c-1", "page": "/"}
    stray = {"type": "event", "id": "x-1", "note": "hello"}
    out = process(_slice([_ORDER, click, stray]))
    assert out.dead_letters == []
    assert set(_columns(catalog, "raw.click")) == {"type", "kind", "id", "page"}
    assert set(_columns(catalog, "shop.other")) == {"type", "id", "note"}


# --------------------------------------------------------------------------------------------
# The timestamp rule


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["2024-05-01T10:00:00Z", None, "2024-05-01 11:30:00.250+02:00"], _TZ),
        (["2024-05-01T10:00:00", "2024-05-01T10:00"], pa.timestamp("us")),
        (["2024-05-01T10:00:00Z", "2024-05-01T10:00:00"], None),  # zone on some only
        (["2024-05-01T10:00:00Z", "soon"], None),  # one value does not fit
        (["2024-05-01T10:00:00Z", "2024-13-01T10:00:00Z"], None),  # looks right, is no date
        (["2024-05-01", "2024-05-02"], None),  # dates are not date-times
        ([None, None], None),
    ],
)
def test_iso_strings_become_timestamps_only_when_every_value_is_one(
    values: list[str | None], expected: pa.DataType | None
) -> None:
    assert timestamp_type(pa.array(values, pa.string()), "when") == expected


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        ("ts", [1_767_225_600_000, None, 1_767_225_600_250], _TZ),
        ("createdAt", [946_684_800_000], _TZ),
        ("event_time", [1_767_225_600_000, 4_102_444_799_999], _TZ),
        ("ts", [1_767_225_600_000, 1_767_225_600], None),  # one value in seconds
        ("ts", [1_767_225_600_000_000], None),  # microseconds
        ("amount", [1_767_225_600_000], None),  # the name does not say time
    ],
)
def test_epoch_millis_become_timestamps_by_name_and_range(
    name: str, values: list[int | None], expected: pa.DataType | None
) -> None:
    assert timestamp_type(pa.array(values, pa.int64()), name) == expected


def test_time_names() -> None:
    said = [
        "ts",
        "TS",
        "time",
        "timestamp",
        "created_at",
        "sent_ts",
        "eventTime",
        "timestampMs",
        "updated_timestamp",
    ]
    assert all(time_named(n) for n in said)
    assert not any(time_named(n) for n in ["id", "status", "format", "times", "tsunami", "count"])


def test_schema_rule_reaches_struct_fields_and_can_be_turned_off() -> None:
    rows = pa.table(
        {
            "ts": [1_767_225_600_000, 1_767_225_601_000],
            "meta": [{"seen_at": "2024-05-01T10:00:00Z"}, {"seen_at": "2024-05-02T10:00:00Z"}],
        }
    )
    on = Inference().schema(rows)
    assert on.field("ts").type == _TZ and on.field("meta").type == pa.struct([pa.field("seen_at", _TZ)])
    off = Inference(timestamps=False).schema(rows)
    assert off.field("ts").type == pa.int64()
    assert off.field("meta").type == pa.struct([pa.field("seen_at", pa.string())])


def test_inferred_timestamps_end_to_end_and_a_later_misfit_is_a_dead_letter(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    first = [
        {**_ORDER, "ts": "2026-01-01T00:00:00.250Z", "local": "2026-01-01 09:00:00"},
        {**_PAYMENT, "ts": 1_767_225_600_250},
    ]
    out = process(_slice(first))
    orders = catalog.load_table("shop.orders").schema()
    payments = catalog.load_table("shop.payments").schema()
    assert orders.find_field("ts").field_type == TimestamptzType()
    assert orders.find_field("local").field_type == TimestampType()
    assert payments.find_field("ts").field_type == TimestamptzType()
    stamps = {name: out.tables[name].rows.column("ts").cast(pa.int64()).to_pylist() for name in out.tables}
    assert stamps == {"shop.orders": [1_767_225_600_250_000], "shop.payments": [1_767_225_600_250_000]}

    later = [
        {**_ORDER, "ts": "2026-01-02T00:00:00+01:00", "local": "2026-01-02 10:00:00"},
        {**_ORDER, "id": "o-2", "ts": "next tuesday", "local": "2026-01-02 10:00:00"},
        {**_PAYMENT, "ts": 1_767_312_000_000},
    ]
    out = process(_slice(later, start=100))
    assert out.tables["shop.orders"].rows.column("id").to_pylist() == ["o-1"]
    assert out.tables["shop.payments"].rows.num_rows == 1
    (letter,) = out.dead_letters
    assert deadletter.header(letter, deadletter.COLUMN) == "ts"
    assert deadletter.header(letter, "fanout-sink.source.offset") == "101"
    assert "next tuesday" in (deadletter.header(letter, deadletter.REASON) or "")


def test_one_misfit_in_the_first_rows_keeps_the_column_as_sent(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    process(_slice([{**_ORDER, "ts": "2026-01-01T00:00:00Z"}, {**_ORDER, "id": "o-2", "ts": "unknown"}]))
    process(_slice([{**_PAYMENT, "ts": 1_767_225_600_000}, {**_PAYMENT, "id": "p-2", "ts": 0}], start=2))
    assert catalog.load_table("shop.orders").schema().find_field("ts").field_type == StringType()
    assert catalog.load_table("shop.payments").schema().find_field("ts").field_type == LongType()


def test_conversion_infer_timestamps_false_opts_out(catalog_settings: CatalogSettings, catalog: Any) -> None:
    tables = {"shop.payments": {"when": "type == 'payment'", "conversion": {"infer-timestamps": False}}}
    process = build_processor(_config(catalog_settings, tables=tables), catalog)
    process(_slice([{**_PAYMENT, "ts": 1_767_225_600_000, "at": "2026-01-01T00:00:00Z"}]))
    assert _columns(catalog, "shop.payments")["ts"] == "long"
    assert _columns(catalog, "shop.payments")["at"] == "string"


def test_a_carried_null_column_keeps_the_type_its_decoder_gave() -> None:
    """Avro and Protobuf records carry every schema field: an always-null one keeps its declared
    type; a JSON null (Arrow's null type) becomes a string; an uncarried one is left out."""
    rows = pa.table(
        {"id": [1, 2], "score": pa.nulls(2, pa.int64()), "note": pa.nulls(2), "other": pa.nulls(2)}
    )
    schema = Inference(carried=lambda path: path != ("other",)).schema(rows)
    assert schema.names == ["id", "score", "note"]
    assert schema.field("score").type == pa.int64() and schema.field("note").type == pa.string()
    assert Inference(skip_null_columns=True).schema(rows).names == ["id"]
