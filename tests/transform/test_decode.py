"""Decoders: batch JSON, Avro with a schema file, Confluent wire-format Avro via a registry."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from support.registry import FakeClock, Registry, wire

from fanout_sink.avro_schema import avro_to_arrow_schema
from fanout_sink.transform.convert import convert
from fanout_sink.transform.formats.avro import AvroDecoder, AvroReader
from fanout_sink.transform.formats.json import MAX_NESTING, JsonDecoder
from fanout_sink.transform.formats.registry import RegistryDecoder

ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "int"}},
    ],
}


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"c{i}" if i % 2 else None,
        "amount": Decimal("12.34"),
        "ts": datetime(2024, 5, 1, tzinfo=UTC),
        "tags": ["a", "b"],
        "attrs": {"x": i},
    }


def test_json_batch_decodes_in_one_pass() -> None:
    values = pa.array(
        [
            b'{"id": 1, "ts": "2024-05-01T10:00:00Z", "customer": {"id": "c1"}, "items": [1, 2]}',
            b'{\n  "id": 2,\r\n  "ts": "2024-05-01"\n}',
        ]
    )
    decoded = JsonDecoder()(values)
    assert decoded.failures == []
    assert decoded.rows.tolist() == [0, 1]
    # ISO strings stay strings (no Arrow timestamp inference): conversion owns their meaning.
    assert decoded.records.schema.field("ts").type == pa.string()
    assert decoded.records.column("ts").to_pylist() == ["2024-05-01T10:00:00Z", "2024-05-01"]
    assert decoded.records.column("customer").to_pylist() == [{"id": "c1"}, None]
    assert decoded.python()[0]["items"] == [1, 2]


def test_json_bad_values_are_isolated() -> None:
    values = pa.array([b'{"id": 1}', b"not json", b"[1, 2]", b"", b'{"id": 4}', b"42"])
    decoded = JsonDecoder()(values)
    assert decoded.rows.tolist() == [0, 4]
    assert decoded.records.column("id").to_pylist() == [1, 4]
    reasons = dict(decoded.failures)
    assert set(reasons) == {1, 2, 3, 5}
    assert reasons[1].startswith("invalid JSON")
    assert reasons[2] == "value is a JSON array, not an object"
    assert reasons[5] == "value is a JSON number, not an object"


def test_json_mixed_types_are_kept_as_text_and_marked_lossy() -> None:
    decoded = JsonDecoder()(pa.array([b'{"v": 1, "w": "a"}', b'{"v": "one", "w": "b"}']))
    assert decoded.failures == []
    assert decoded.lossy == frozenset({"v"})
    assert decoded.records.column("v").to_pylist() == ["1", "one"]
    assert decoded.python() == [{"v": 1, "w": "a"}, {"v": "one", "w": "b"}]


def test_avro_with_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(ORDER_SCHEMA))
    decoder = AvroDecoder(json.loads(path.read_text()))
    values = pa.array([_avro(ORDER_SCHEMA, _order(1)), b"\x01\x02", _avro(ORDER_SCHEMA, _order(2))])
    decoded = decoder(values)
    assert decoded.rows.tolist() == [0, 2]
    assert [i for i, _ in decoded.failures] == [1]
    assert decoded.records.schema == avro_to_arrow_schema(ORDER_SCHEMA)
    first = decoded.records.to_pylist()[0]
    assert first["amount"] == Decimal("12.34")
    assert first["attrs"] == [("x", 1)]
    assert decoded.records.schema.field("id").nullable is False
    assert decoded.records.schema.field("customer").nullable is True


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry({7: ORDER_SCHEMA})
    yield reg
    reg.close()


def test_confluent_avro_resolves_and_caches_schema(registry: Registry, registry_clock: FakeClock) -> None:
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, unknown_id_timeout_s=0)
    values = pa.array(
        [
            wire(7, _avro(ORDER_SCHEMA, _order(1))),
            b"\x01plain",
            wire(99, b"\x00"),
            wire(7, _avro(ORDER_SCHEMA, _order(2))),
        ]
    )
    decoded = decoder(values)
    assert decoded.rows.tolist() == [0, 3]
    assert decoded.records.column("id").to_pylist() == [1, 2]
    reasons = dict(decoded.failures)
    assert "not Confluent wire format" in reasons[1]
    assert reasons[2].startswith("unknown schema id 99 in the Schema Registry")
    asked = len(registry.requests)
    decoder(pa.array([wire(7, _avro(ORDER_SCHEMA, _order(3)))]))
    assert len(registry.requests) == asked  # cached per id


def test_confluent_avro_resolves_schema_references(registry: Registry) -> None:
    """Named types registered as their own subjects (Money, which uses Currency) and named in
    the writer schema's references, as confluent-kafka's AvroSerializer writes them."""
    currency = {"type": "enum", "name": "Currency", "namespace": "shop", "symbols": ["EUR", "USD"]}
    money = {
        "type": "record",
        "name": "Money",
        "namespace": "shop",
        "fields": [{"name": "currency", "type": "shop.Currency"}, {"name": "cents", "type": "long"}],
    }
    order = {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "shop.Money"}],
    }
    client = SchemaRegistryClient({"url": registry.url})
    client.register_schema("shop.Currency", Schema(json.dumps(currency), "AVRO"))
    uses_currency = [SchemaReference("shop.Currency", "shop.Currency", 1)]
    client.register_schema("shop.Money", Schema(json.dumps(money), "AVRO", uses_currency))
    writer = Schema(json.dumps(order), "AVRO", [SchemaReference("shop.Money", "shop.Money", 1)])
    serialize = AvroSerializer(client, writer)
    context = SerializationContext("orders", MessageField.VALUE)
    value = serialize({"id": 1, "total": {"currency": "USD", "cents": 250}}, context)
    missing_id = registry.register(
        "broken-value",
        json.dumps(order),
        references=[{"name": "shop.Money", "subject": "gone", "version": 1}],
    )
    decoded = RegistryDecoder(AvroReader, {"url": registry.url}, unknown_id_timeout_s=0)(
        pa.array([value, wire(missing_id, b"")])
    )
    assert decoded.records.to_pylist() == [{"id": 1, "total": {"currency": "USD", "cents": 250}}]
    assert decoded.records.schema.field("total").type == pa.struct(
        [pa.field("currency", pa.string(), nullable=False), pa.field("cents", pa.int64(), nullable=False)]
    )
    [(index, reason)] = decoded.failures
    assert index == 1
    assert reason.startswith(f"schema id {missing_id} references a schema the registry does not have")


@pytest.mark.parametrize("per_record", [False, True])
def test_json_value_must_be_utf8_not_guessed(per_record: bool) -> None:
    """json.loads of bytes guesses UTF-16 from a BOM or NULs; the sink takes UTF-8 only, and says where."""
    utf16 = '{"id": 2}'.encode("utf-16")  # starts with the BOM \xff\xfe
    latin1 = '{"id": 3, "name": "café"}'.encode("latin-1")
    decoded = JsonDecoder(per_record=per_record)(pa.array([b'{"id": 1}', utf16, latin1]))
    assert decoded.rows.tolist() == [0]
    reasons = dict(decoded.failures)
    assert reasons[1].startswith("value is not UTF-8: byte 0xff at offset 0")
    assert reasons[2].startswith("value is not UTF-8: byte 0xe9 at offset 22")
    assert "utf-16" not in reasons[1]


@pytest.mark.parametrize("per_record", [False, True])
def test_json_nan_and_infinity_are_not_json(per_record: bool) -> None:
    """Arrow's parser and json.loads both accept NaN; a NaN would land in a table as a number."""
    values = pa.array([b'{"id": 1, "v": 1.5}', b'{"id": 2, "v": NaN}', b'{"id": 3, "v": [-Infinity]}'])
    decoded = JsonDecoder(per_record=per_record)(values)
    assert decoded.rows.tolist() == [0]
    assert [reason.split(" is not")[0] for _, reason in decoded.failures] == [
        "invalid JSON: NaN",
        "invalid JSON: -Infinity",
    ]


@pytest.mark.parametrize("per_record", [False, True])
def test_json_deep_nesting_is_a_dead_letter_not_a_crash(per_record: bool) -> None:
    """Arrow's parser segfaults at ~20 000 levels and json.loads raises RecursionError at ~1 000."""
    deep = b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    brackets_in_string = b'{"id": 2, "s": "' + b"[" * 5000 + b'"}'
    at_limit = b'{"a": ' + b"[" * (MAX_NESTING - 1) + b"]" * (MAX_NESTING - 1) + b"}"
    values = pa.array([b'{"id": 1}', deep, brackets_in_string, at_limit])
    decoded = JsonDecoder(per_record=per_record)(values)
    assert decoded.rows.tolist() == [0, 2, 3]
    assert decoded.failures == [(1, f"value nests 50001 levels deep; the limit is {MAX_NESTING}")]


@pytest.mark.parametrize("per_record", [False, True])
def test_json_unpaired_surrogate_escape_is_a_dead_letter(per_record: bool) -> None:
    """ "\\ud800" is valid JSON syntax but no character: building the Arrow string used to raise."""
    values = pa.array([b'{"s": "\\ud83d\\ude00"}', b'{"s": "\\ud800"}', b'{" \\udc00": 1}'])
    decoded = JsonDecoder(per_record=per_record)(values)
    assert decoded.records.column("s").to_pylist() == ["\U0001f600"]
    assert decoded.failures[0][0] == 1 and "unpaired surrogate escape (\\ud800)" in decoded.failures[0][1]
    # A lone low surrogate, in a key: the screen once looked for high ones only (found by Hypothesis).
    assert decoded.failures[1][0] == 2 and "unpaired surrogate escape (\\udc00)" in decoded.failures[1][1]


def test_integer_beyond_int64_does_not_round_its_neighbours() -> None:
    """Arrow's parser turns a column with one int beyond int64 into double, rounding every large id."""
    values = pa.array([b'{"id": 9007199254740993}', b'{"id": 123456789012345678901234567890}'])
    decoded = JsonDecoder()(values)
    converted = convert(decoded.records, pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    assert converted.rows.column("id").to_pylist() == [9007199254740993]
    ((position, column, reason),) = converted.failures
    assert (position, column) == (1, "id") and "123456789012345678901234567890" in reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"null", "value is a JSON null, not an object"),  # first in Arrow's input, it segfaulted
        (b" \n null", "value is a JSON null, not an object"),
        (b'{"k\r": "v"}', "invalid JSON: Invalid control character"),  # was read as key "k "
        (b'{"k": "line\nbreak"}', "invalid JSON: Invalid control character"),
    ],
)
def test_values_arrows_parser_mishandles_are_isolated(value: bytes, reason: str) -> None:
    """Found by tests/transform/test_properties.py: both decoding paths must agree with json.loads."""
    for per_record in (False, True):
        decoded = JsonDecoder(per_record=per_record)(pa.array([value, b'{"id": 1}', b'{"id": 2}']))
        assert decoded.rows.tolist() == [1, 2]
        assert decoded.records.column("id").to_pylist() == [1, 2]
        ((index, got),) = decoded.failures
        assert index == 0 and got.startswith(reason), got


def test_lists_starting_with_null_do_not_become_invalid_arrays() -> None:
    """Arrow's JSON reader builds ``[null, false]`` as a list array whose offsets pass its values' end."""
    values = pa.array([b'{"a": [null, false], "b": {"c": [[null, null]]}}', b'{"a": []}'])
    decoded = JsonDecoder()(values)
    decoded.records.validate(full=True)
    assert decoded.records.column("a").to_pylist() == [[None, False], []]
    assert decoded.python()[0]["b"] == {"c": [[None, None]]}
