"""Debezium events in each form the sink reads: plain JSON, Kafka Connect's ``{"schema", "payload"}``
JSON wrapper (its logical types becoming Iceberg types) and Schema Registry Avro."""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from pyiceberg.types import DateType, DecimalType, TimestampType, TimestamptzType, TimeType
from support.raw_slices import make_raw_slice
from support.registry import Registry, wire

from fanout_sink.avro_schema import CONNECT_NAME
from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.transform import deadletter
from fanout_sink.transform.debezium import CONNECT_SCALE, apply_logical_types
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.records import RoutedSlice

TOPIC = "dbserver1.crm.customers"

# Debezium's Postgres connector through Connect's JsonConverter (schemas.enable=true): the row columns.
COLUMNS: list[dict[str, Any]] = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "birth"},
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
        "field": "seen",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.Timestamp",
        "version": 1,
        "field": "seen_ms",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.NanoTimestamp",
        "version": 1,
        "field": "seen_ns",
    },
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "field": "changed",
    },
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "balance",
    },
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1, "field": "opens"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Time", "version": 1, "field": "closes"},
]
SCHEMA: dict[str, Any] = {
    "type": "struct",
    "name": "dbserver1.crm.customers.Envelope",
    "optional": False,
    "fields": [
        {
            "type": "struct",
            "fields": COLUMNS,
            "optional": True,
            "name": "dbserver1.crm.customers.Value",
            "field": f,
        }
        for f in ("before", "after")
    ]
    + [
        {
            "type": "struct",
            "fields": [{"type": "string", "optional": False, "field": "table"}],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def _unscaled(value: int) -> str:
    """Connect's Decimal in JSON: the unscaled value's big-endian two's complement bytes, base64."""
    return base64.b64encode(value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)).decode()


def _row(key: int, **changes: Any) -> dict[str, Any]:
    row = {
        "id": key,
        "name": f"n{key}",
        "birth": 19_000,  # days since 1970-01-01
        "seen": 1_700_000_000_123_456,  # microseconds
        "seen_ms": 1_700_000_000_123,
        "seen_ns": 1_700_000_000_123_456_789,
        "changed": "2023-11-14T22:13:20.5+01:00",
        "balance": _unscaled(-123_456),  # -1234.56
        "opens": 8 * 3600 * 1_000_000 + 1,  # 08:00:00.000001
        "closes": 17 * 3600 * 1000 + 500,  # 17:00:00.500
    }
    return {**row, **changes}


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    return {"op": op, "before": before, "after": after, "source": {"table": "customers"}, "ts_ms": 1}


def _wrapped(event: dict[str, Any], schema: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return {"schema": schema, "payload": event}


def _processor(catalog_settings: CatalogSettings, catalog: Any, **source: Any) -> RoutingProcessor:
    config = parse_config(
        {
            "name": "cdc",
            "source": {"topics": [TOPIC], **source},
            "catalog": catalog_settings.model_dump(),
            "dead-letter": {"topic": "dlq"},
            "tables": {
                "crm.customers": {
                    "when": "source.table == 'customers'",
                    "changes": {"format": "debezium", "key": ["id"]},
                }
            },
        },
        "sink.yaml",
    )
    return build_processor(config, catalog)


def _run(process: RoutingProcessor, values: list[Any]) -> RoutedSlice:
    encoded = [v if isinstance(v, bytes) else json.dumps(v).encode() for v in values]
    out = process(make_raw_slice(encoded, topic=TOPIC))
    assert process.last_stats.reconciles(), process.last_stats
    return out


EXPECTED = {
    "id": 1,
    "name": "n1",
    "birth": date(2022, 1, 8),
    "seen": datetime(2023, 11, 14, 22, 13, 20, 123456),
    "seen_ms": datetime(2023, 11, 14, 22, 13, 20, 123000),
    "seen_ns": datetime(2023, 11, 14, 22, 13, 20, 123456),  # Iceberg keeps microseconds
    "changed": datetime(2023, 11, 14, 21, 13, 20, 500000, tzinfo=UTC),
    "balance": Decimal("-1234.56"),
    "opens": time(8, 0, 0, 1),
    "closes": time(17, 0, 0, 500000),
}


def test_the_connect_json_wrapper_gives_logical_types_their_iceberg_types(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = _processor(catalog_settings, catalog)
    out = _run(
        process,
        [
            _wrapped(_event("c", None, _row(1, name="first"))),
            _wrapped(_event("u", _row(1, name="first"), _row(1))),
            _wrapped(_event("c", None, _row(2))),
            _wrapped(_event("d", _row(2), None)),
        ],
    )
    customers = out.tables["crm.customers"]
    assert customers.rows.to_pylist() == [EXPECTED]
    assert customers.deleted_keys is not None and customers.deleted_keys.column("id").to_pylist() == [2]
    schema = customers.table.schema()
    types = {name: schema.find_field(name).field_type for name in EXPECTED}
    assert types["birth"] == DateType() and types["seen"] == TimestampType() == types["seen_ns"]
    assert types["changed"] == TimestamptzType() and types["balance"] == DecimalType(10, 2)
    assert types["opens"] == TimeType() == types["closes"]
    assert schema.identifier_field_names() == {"id"}


def test_plain_json_events_go_the_same_way_without_logical_types(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = _processor(catalog_settings, catalog)
    out = _run(
        process, [_event("c", None, {"id": 1, "name": "a"}), _event("u", None, {"id": 1, "name": "b"})]
    )
    assert out.tables["crm.customers"].rows.to_pylist() == [{"id": 1, "name": "b"}]


def test_a_wrapped_batch_whose_types_differ_is_unwrapped_per_record(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """``name`` is a number in one event and text in another: the decoder keeps such columns as
    JSON text, and the payload is read from the records as Python objects instead."""
    process = _processor(catalog_settings, catalog)
    out = _run(
        process,
        [
            _wrapped(_event("c", None, {"id": 1, "name": 5})),
            _wrapped(_event("c", None, {"id": 2, "name": "b"})),
        ],
    )
    rows = sorted(out.tables["crm.customers"].rows.to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "name": "5"}, {"id": 2, "name": "b"}]


def test_schemas_that_disagree_on_a_logical_type_leave_the_column_as_sent(
    catalog_settings: CatalogSettings, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    other = copy.deepcopy(SCHEMA)
    for section in other["fields"][:2]:
        section["fields"][2] = {"type": "int32", "optional": True, "field": "birth"}  # a plain number now
    process = _processor(catalog_settings, catalog)
    with caplog.at_level(logging.WARNING):
        out = _run(
            process, [_wrapped(_event("c", None, _row(1))), _wrapped(_event("c", None, _row(2)), other)]
        )
    assert "disagree on column birth's logical type" in caplog.text
    assert out.tables["crm.customers"].rows.column("birth").to_pylist() == [19_000, 19_000]
    assert out.tables["crm.customers"].rows.column("seen").type == pa.timestamp("us")


def test_a_value_its_logical_type_cannot_read_is_left_for_conversion_to_judge() -> None:
    zoned = {CONNECT_NAME: b"io.debezium.time.ZonedTimestamp"}
    decimal = {CONNECT_NAME: b"org.apache.kafka.connect.data.Decimal", CONNECT_SCALE: b"1"}
    image = pa.table(
        {
            "changed": pa.array(["2023-11-14T22:13:20Z", "not a time"]),
            "amount": pa.array([_unscaled(15), "!!"]),
            "unknown": pa.array([1, 2]),
        }
    )
    image = image.cast(
        pa.schema(
            [
                pa.field("changed", pa.string(), metadata=zoned),
                pa.field("amount", pa.string(), metadata=decimal),
                pa.field("unknown", pa.int64(), metadata={CONNECT_NAME: b"io.debezium.data.Json"}),
            ]
        )
    )
    assert apply_logical_types(image).column_names == image.column_names
    assert [f.type for f in apply_logical_types(image).schema] == [pa.string(), pa.string(), pa.int64()]
    good = image.slice(0, 1)
    converted = apply_logical_types(good)
    assert converted.column("amount").to_pylist() == [Decimal("1.5")]
    assert converted.column("changed").type == pa.timestamp("us", tz="UTC")


def test_tombstones_after_wrapped_deletes_are_filtered(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = _processor(catalog_settings, catalog)
    values: list[Any] = [json.dumps(_wrapped(_event("d", _row(1), None))).encode(), None]
    out = process(make_raw_slice(values, topic=TOPIC))
    assert (process.last_stats.filtered, process.last_stats.deletes, out.dead_letters) == (1, 1, [])


# --------------------------------------------------------------------------------------------
# Schema Registry Avro: the same event shape, no wrapper

VALUE = {
    "type": "record",
    "name": "Value",
    "namespace": "dbserver1.crm.customers",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "birth", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        # Debezium's own types as Connect's AvroConverter writes them: plain Avro, named by connect.name.
        {
            "name": "since",
            "type": {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"},
        },
        {
            "name": "seen",
            "type": [
                "null",
                {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"},
            ],
            "default": None,
        },
        {
            "name": "balance",
            "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
            "default": None,
        },
    ],
}
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver1.crm.customers",
    "fields": [
        {"name": "before", "type": ["null", VALUE], "default": None},
        {"name": "after", "type": ["null", "dbserver1.crm.customers.Value"], "default": None},
        {
            "name": "source",
            "type": {"type": "record", "name": "Source", "fields": [{"name": "table", "type": "string"}]},
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


@pytest.fixture
def registry() -> Iterator[Registry]:
    served = Registry({11: ENVELOPE})
    yield served
    served.close()


def _avro(event: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, parse_schema(copy.deepcopy(ENVELOPE)), event)
    return wire(11, buffer.getvalue())


def test_confluent_avro_debezium_events(
    catalog_settings: CatalogSettings, catalog: Any, registry: Registry
) -> None:
    source = {"format": "confluent-avro", "schema-registry": {"url": registry.url}}
    process = _processor(catalog_settings, catalog, **source)
    row = {"id": 1, "name": "a", "birth": date(2022, 1, 8), "since": 19_000, "seen": 1_700_000_000_123_456}
    row["balance"] = Decimal("12.50")
    expected = {**row, "since": date(2022, 1, 8), "seen": datetime(2023, 11, 14, 22, 13, 20, 123456)}
    values: list[bytes | None] = [
        _avro(_event("c", None, row)),
        _avro(_event("u", row, {**row, "name": "b"})),
        _avro(_event("c", None, {**row, "id": 2})),
        _avro(_event("d", {**row, "id": 2}, None)),
        None,
        _avro({**_event("c", None, None), "op": "m"}),  # not a row change
    ]
    out = process(make_raw_slice(values, topic=TOPIC))
    assert process.last_stats.reconciles()
    customers = out.tables["crm.customers"]
    assert customers.rows.to_pylist() == [{**expected, "name": "b"}]
    assert customers.deleted_keys is not None and customers.deleted_keys.to_pylist() == [{"id": 2}]
    assert customers.table.schema().find_field("balance").field_type == DecimalType(10, 2)
    assert customers.table.schema().find_field("since").field_type == DateType()
    assert customers.table.schema().find_field("seen").field_type == TimestampType()
    assert customers.table.schema().identifier_field_names() == {"id"}
    assert [dict(d.headers)[deadletter.STAGE] for d in out.dead_letters] == [b"decode"]
    assert process.last_stats.filtered == 1
    assert np.array_equal(process.last_stats.rows_per_table["crm.customers"], 1)


def test_schemas_arrow_cannot_join_are_read_as_python_objects(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """One event's schema gives the scale as a number: the wrapper's schemas are then no single
    Arrow type, and their logical types are read from the records as Python objects."""
    other = copy.deepcopy(SCHEMA)
    for section in other["fields"][:2]:
        section["fields"][7]["parameters"] = {"scale": 2, "connect.decimal.precision": 10}
    process = _processor(catalog_settings, catalog)
    out = _run(process, [_wrapped(_event("c", None, _row(1))), _wrapped(_event("c", None, _row(2)), other)])
    rows = out.tables["crm.customers"].rows
    assert rows.column("balance").to_pylist() == [Decimal("-1234.56")] * 2
    assert rows.column("birth").to_pylist() == [date(2022, 1, 8)] * 2
