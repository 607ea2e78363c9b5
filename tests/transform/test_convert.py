"""Conversion to a table's Arrow schema: coercions, nesting, name mapping, per-row failures."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from fanout_sink.transform.convert import Matching, convert


def _one(iceberg_type: Any, values: list[Any], required: bool = False) -> tuple[list[Any], list[Any]]:
    schema = Schema(NestedField(1, "c", iceberg_type, required=required)).as_arrow()
    result = convert(pa.table({"c": values}), schema)
    assert result.rows.schema.equals(schema, check_metadata=True)
    return result.rows.column("c").to_pylist(), result.failures


def test_numbers_from_strings_and_numbers() -> None:
    values, failures = _one(LongType(), ["42", " 7 ", "4.0", "x", "1.5"])
    assert values == [42, 7, 4]
    assert [(p, c) for p, c, _ in failures] == [(3, "c"), (4, "c")]
    assert "cannot convert 'x' (string) to int64" in failures[0][2]
    assert _one(IntegerType(), [1, 2**40])[1][0][0] == 1  # overflow fails the row
    assert _one(DoubleType(), ["1.5", "2e3"])[0] == [1.5, 2000.0]
    assert _one(FloatType(), [1, 2])[0] == [1.0, 2.0]


def test_timestamps_with_and_without_zone_and_epoch_millis() -> None:
    inputs = [
        "2024-05-01T10:00:00Z",
        "2024-05-01T12:00:00+02:00",
        "2024-05-01 11:00:00 +0100",
        "2024-05-01 10:00:00",
        "2024-05-01T10:00:00.123456",
        "1714557600000",
        "2024-05-01",
    ]
    values, failures = _one(TimestamptzType(), inputs)
    assert failures == []
    ten = datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert values[:4] == [ten, ten, ten, ten]
    assert values[4] == datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert values[5] == ten
    assert values[6] == datetime(2024, 5, 1, tzinfo=UTC)
    naive, failures = _one(TimestampType(), ["2024-05-01T12:00:00+02:00", "2024-05-01T10:00:00"])
    assert failures == []
    assert naive == [datetime(2024, 5, 1, 10), datetime(2024, 5, 1, 10)]
    assert _one(TimestampType(), [1714557600000])[0] == [datetime(2024, 5, 1, 10)]
    assert _one(TimestamptzType(), [1714557600000])[0] == [ten]
    assert _one(TimestamptzType(), ["yesterday"])[1][0][0] == 0


def test_dates_decimals_booleans() -> None:
    assert _one(DateType(), ["2024-05-01", "2024-05-01T23:00:00Z"])[0] == [date(2024, 5, 1)] * 2
    values, failures = _one(DecimalType(10, 2), ["1.005", "-1.005", "12.3", "1e2"])
    assert failures == []
    assert values == [Decimal("1.01"), Decimal("-1.01"), Decimal("12.30"), Decimal("100.00")]
    assert _one(DecimalType(10, 2), [2.675, -0.125])[0] == [Decimal("2.68"), Decimal("-0.13")]
    assert _one(DecimalType(10, 2), [3])[0] == [Decimal("3.00")]
    assert _one(DecimalType(4, 2), ["123.45"])[1][0][0] == 0  # does not fit the precision
    values, failures = _one(BooleanType(), ["true", "FALSE", "yes", "n", "1", "maybe", None])
    assert values == [True, False, True, False, True, None]
    assert [p for p, _, _ in failures] == [5]


def test_strings_from_anything() -> None:
    values, _ = _one(StringType(), [1, 2])
    assert values == ["1", "2"]
    values, _ = _one(StringType(), [{"a": 1}, None])
    assert values == ['{"a": 1}', None]


def test_nested_structs_lists_and_maps() -> None:
    schema = Schema(
        NestedField(
            1, "customer", StructType(NestedField(2, "id", LongType(), required=True)), required=False
        ),
        NestedField(3, "items", ListType(4, IntegerType(), element_required=False), required=False),
        NestedField(
            5, "attrs", MapType(6, StringType(), 7, LongType(), value_required=False), required=False
        ),
    ).as_arrow()
    rows = pa.table(
        {
            "customer": [{"id": "1"}, {"id": None}, None, {"id": "x"}],
            "items": [["1", "2"], [], None, ["3"]],
            "attrs": [{"a": 1, "b": None}, {"a": None, "b": 2}, None, {"a": 3, "b": 4}],
        }
    )
    result = convert(rows, schema)
    assert result.positions.tolist() == [0, 2]
    assert result.rows.to_pylist() == [
        {"customer": {"id": 1}, "items": [1, 2], "attrs": [("a", 1)]},
        {"customer": None, "items": None, "attrs": None},
    ]
    assert [(p, c) for p, c, _ in result.failures] == [(1, "customer.id"), (3, "customer.id")]
    assert "required column 'customer.id' is missing or null" in result.failures[0][2]
    list_failure = convert(pa.table({"items": [["1", "x"]]}), schema).failures
    assert list_failure[0][1] == "items[]"


def test_missing_optional_is_null_missing_required_fails() -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "note", StringType(), required=False)
    ).as_arrow()
    result = convert(pa.table({"id": [1, None]}), schema)
    assert result.rows.to_pylist() == [{"id": 1, "note": None}]
    assert result.failures[0][:2] == (1, "id")
    result = convert(pa.table({"other": [1]}), schema)
    assert result.rows.num_rows == 0 and result.failures[0][1] == "id"


def test_name_mapping_and_case_insensitive() -> None:
    schema = Schema(
        NestedField(1, "customer_id", LongType(), required=False),
        NestedField(2, "total", DoubleType(), required=False),
    ).as_arrow()
    rows = pa.table({"customerId": [1], "TOTAL": [2.5]})
    assert convert(rows, schema).rows.to_pylist() == [{"customer_id": None, "total": None}]
    matching = Matching(name_mapping={"customer_id": ["cust_id", "customerId"]}, case_insensitive=True)
    assert convert(rows, schema, matching).rows.to_pylist() == [{"customer_id": 1, "total": 2.5}]


# --- property: conversion never raises; a row either converts or is reported with its column -----

TARGET = Schema(
    NestedField(1, "i", IntegerType(), required=False),
    NestedField(2, "l", LongType(), required=True),
    NestedField(3, "d", DecimalType(9, 3), required=False),
    NestedField(4, "t", TimestamptzType(), required=False),
    NestedField(5, "dt", DateType(), required=False),
    NestedField(6, "b", BooleanType(), required=False),
    NestedField(7, "s", StringType(), required=False),
    NestedField(8, "f", DoubleType(), required=False),
).as_arrow()

_scalars = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
    st.sampled_from(["1", "2.5", "true", "2024-05-01", "2024-05-01T10:00:00Z", "1714557600000", "-3"]),
    st.booleans(),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({name: _scalars for name in TARGET.names}), min_size=1, max_size=10))
def test_conversion_never_raises(records: list[dict[str, Any]]) -> None:
    # One type per column (as a decoded batch has): stringify columns that mix types.
    columns: dict[str, list[Any]] = {}
    for name in TARGET.names:
        values = [r[name] for r in records]
        kinds = {type(v) for v in values if v is not None}
        columns[name] = [None if v is None else str(v) for v in values] if len(kinds) > 1 else values
    rows = pa.table(columns)
    result = convert(rows, TARGET)
    assert result.rows.schema.equals(TARGET, check_metadata=True)
    failed = [p for p, _, _ in result.failures]
    assert len(failed) == len(set(failed))
    assert sorted(failed + result.positions.tolist()) == list(range(len(records)))
    for _, column, reason in result.failures:
        assert column in TARGET.names and column in reason
    assert result.rows.column("l").null_count == 0


@pytest.mark.parametrize("n", [1, 1000])
def test_one_bad_value_is_isolated_by_bisection(n: int) -> None:
    values = [str(i) for i in range(n)]
    values[n // 2] = "bad"
    converted, failures = _one(LongType(), values)
    assert len(converted) == n - 1
    assert [p for p, _, _ in failures] == [n // 2]


def test_nested_values_from_json_text() -> None:
    """A field that changed type within a batch arrives as JSON text and still converts."""
    schema = Schema(
        NestedField(
            1, "customer", StructType(NestedField(2, "id", LongType(), required=False)), required=False
        ),
        NestedField(3, "tags", ListType(4, StringType(), element_required=False), required=False),
    ).as_arrow()
    rows = pa.table({"customer": ['{"id": 1}', "7", None], "tags": ['["a"]', "[]", '"x"']})
    result = convert(rows, schema)
    assert result.rows.to_pylist() == [{"customer": {"id": 1}, "tags": ["a"]}]
    assert [(p, c) for p, c, _ in result.failures] == [(1, "customer"), (2, "tags")]
