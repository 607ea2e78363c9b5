"""Schema Registry Protobuf and JSON Schema values through RegistryDecoder: the column types a
descriptor gives, message index paths, and each way a value or its schema can be unusable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import referencing
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from referencing import Resource
from referencing.jsonschema import DRAFT7
from support.raw_slices import make_raw_slice
from support.registry import FakeClock, Registry, compile_protos, message_class, wire

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.errors import RecordError, SchemaError
from fanout_sink.transform.formats.decoded import Decoded
from fanout_sink.transform.formats.json_schema import JsonSchemaReader, json_schema_to_arrow
from fanout_sink.transform.formats.protobuf import ProtobufReader
from fanout_sink.transform.formats.registry import RegistryDecoder
from fanout_sink.transform.processor import build_processor

PROTO = """
syntax = "proto3";
package t;
import "google/protobuf/struct.proto";
import "google/protobuf/wrappers.proto";

message Node {
  string name = 1;
  repeated Node children = 2;
}

message Wide {
  message Inner {
    message Deeper { sint32 x = 1; }
  }
  uint64 big = 1;
  google.protobuf.Int64Value maybe = 2;
  google.protobuf.Struct extra = 3;
  Node tree = 4;
  oneof choice {
    string text = 5;
    int32 number = 6;
  }
  map<int32, Node> nodes = 7;
  google.protobuf.UInt64Value huge = 8;
}
"""
CONTEXT = SerializationContext("t", MessageField.VALUE)


@pytest.fixture
def registry() -> Iterator[Registry]:
    served = Registry({1: {"type": "record", "name": "A", "fields": [{"name": "id", "type": "long"}]}})
    yield served
    served.close()


@pytest.fixture
def classes(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "wide.proto").write_text(PROTO)
    pool = compile_protos(tmp_path, "t/wide.proto")
    return {name: message_class(pool, f"t.{name}") for name in ("Wide", "Wide.Inner.Deeper", "Node")}


def _serializer(registry: Registry, cls: Any) -> Any:
    client = SchemaRegistryClient({"url": registry.url})
    return lambda message: ProtobufSerializer(cls, client, {"use.deprecated.format": False})(message, CONTEXT)


def _decode(decoder: RegistryDecoder, values: list[bytes | None]) -> Decoded:
    return decoder(pa.array(values, pa.binary()))


def test_protobuf_columns_follow_the_descriptor(registry: Registry, classes: dict[str, Any]) -> None:
    wide = classes["Wide"]
    message = wide(big=2**63 - 1, text="hi")
    message.maybe.value = -5
    message.extra.update({"k": [1, "two"]})
    message.tree.name = "root"
    message.tree.children.add(name="leaf").children.add(name="deep")
    message.nodes[3].name = "three"
    decoded = _decode(
        RegistryDecoder(ProtobufReader, {"url": registry.url}, unknown_id_timeout_s=0),
        [_serializer(registry, wide)(message), _serializer(registry, wide)(wide())],
    )
    assert decoded.failures == []
    schema = decoded.records.schema
    assert schema.field("big").type == pa.int64() and not schema.field("big").nullable
    assert schema.field("maybe").type == pa.int64() and schema.field("maybe").nullable  # a wrapper
    assert schema.field("extra").type == pa.string()  # Struct: JSON text
    # Node contains Node: below its first level a tree is JSON text, not an endless struct.
    assert schema.field("tree").type == pa.struct(
        [
            pa.field("name", pa.string(), nullable=False),
            pa.field("children", pa.list_(pa.string()), nullable=False),
        ]
    )
    assert schema.field("text").nullable and schema.field("number").nullable  # oneof members
    assert schema.field("nodes").type.key_type == pa.int32()
    first, empty = decoded.records.to_pylist()
    assert first["big"] == 2**63 - 1 and first["maybe"] == -5 and first["text"] == "hi"
    assert first["number"] is None
    assert json.loads(first["extra"]) == {"k": [1, "two"]}
    assert first["tree"]["name"] == "root"
    assert json.loads(first["tree"]["children"][0]) == {"name": "leaf", "children": [{"name": "deep"}]}
    assert first["nodes"] == [(3, {"name": "three", "children": []})]
    assert empty["big"] == 0 and empty["maybe"] is None and empty["tree"] is None and empty["text"] is None


def test_protobuf_message_index_paths(registry: Registry, classes: dict[str, Any]) -> None:
    """Two message types of one file in one batch: Wide (index path [1]) and Wide.Inner.Deeper
    ([1, 0, 0]); a column one type lacks is null, so optional, in the other's rows."""
    wide, deeper = classes["Wide"], classes["Wide.Inner.Deeper"]
    values = [_serializer(registry, deeper)(deeper(x=-7)), _serializer(registry, wide)(wide(big=3))]
    decoded = _decode(RegistryDecoder(ProtobufReader, {"url": registry.url}, unknown_id_timeout_s=0), values)
    assert decoded.failures == []
    assert decoded.records.schema.field("x").type == pa.int32()
    assert decoded.records.select(["x", "big"]).to_pylist() == [{"x": -7, "big": None}, {"x": None, "big": 3}]
    assert all(f.nullable for f in decoded.records.schema)
    decoded.records.validate(full=True)


def test_protobuf_values_that_cannot_be_read(
    registry: Registry, classes: dict[str, Any], registry_clock: FakeClock
) -> None:
    wide = classes["Wide"]
    good = _serializer(registry, wide)(wide(number=1))
    values = [
        good,
        _serializer(registry, wide)(wide(big=2**63)),
        _serializer(registry, wide)(wide(huge={"value": 2**64 - 1})),
        good[:-1] + b"\xff",  # the last field's value cut short
        wire(1, b"\x00"),  # an Avro schema's id
        wire(99, b"\x00"),
        b"{}",
        None,
    ]
    decoded = _decode(RegistryDecoder(ProtobufReader, {"url": registry.url}, unknown_id_timeout_s=0), values)
    assert decoded.rows.tolist() == [0]
    reasons = dict(decoded.failures)
    assert reasons[1] == "t.Wide.big = 9223372036854775808 does not fit a 64-bit signed integer column"
    assert reasons[2] == (
        "google.protobuf.UInt64Value.value = 18446744073709551615 does not fit a 64-bit signed integer column"
    )
    assert reasons[3].startswith("invalid Protobuf for schema id ")
    assert reasons[4] == "schema id 1 is AVRO, not PROTOBUF; is source.format right?"
    assert reasons[5].startswith("unknown schema id 99 in the Schema Registry")
    assert reasons[6].startswith("not Confluent wire format")
    assert reasons[7] == "value is null"


def test_an_unreachable_registry_stops_instead_of_dead_lettering(classes: dict[str, Any]) -> None:
    served = Registry()
    value = _serializer(served, classes["Wide"])(classes["Wide"]())
    served.close()
    with pytest.raises(SchemaError, match=r"(?s)Schema Registry lookup of schema id 1 failed: .*\n  fix: "):
        _decode(RegistryDecoder(ProtobufReader, {"url": served.url}, unknown_id_timeout_s=0), [value])


def test_json_schema_values_that_cannot_be_read(registry: Registry) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    serialize = JSONSerializer(json.dumps({"type": "array", "items": {"type": "integer"}}), client)
    array = serialize([1, 2], CONTEXT)
    schema_id = int.from_bytes(array[1:5], "big")
    decoded = _decode(
        RegistryDecoder(JsonSchemaReader, {"url": registry.url}, unknown_id_timeout_s=0),
        [array, array[:5] + b"{not json", wire(1, b"{}")],
    )
    assert decoded.rows.tolist() == []
    reasons = dict(decoded.failures)
    assert reasons[0] == f"value for schema id {schema_id} is a JSON list, not an object"
    assert reasons[1].startswith(f"invalid JSON Schema value for schema id {schema_id}: ")
    assert reasons[2] == "schema id 1 is AVRO, not JSON; is source.format right?"


def test_json_schema_types_the_columns_when_it_fixes_them(registry: Registry) -> None:
    """A closed schema (with a reference) fixes the columns: a number is a double even when every
    value in the batch is whole; an open schema's values type them, as for format json."""
    sources = Path(__file__).resolve().parents[2] / "schemas" / "sources" / "shop"
    client = SchemaRegistryClient({"url": registry.url})
    client.register_schema("shop.Money", Schema((sources / "money.schema.json").read_text(), "JSON"))
    reference = SchemaReference("money.schema.json", "shop.Money", 1)
    closed = Schema((sources / "payment.schema.json").read_text(), "JSON", [reference])
    payment = {"id": 1, "order_id": 2, "method": "card", "amount": {"currency": "EUR", "value": 3}, "ts": "x"}
    opened = {"type": "object", "properties": {"id": {"type": "integer"}, "value": {"type": "number"}}}
    values = [
        JSONSerializer(closed, client)(payment, CONTEXT),
        JSONSerializer(json.dumps(opened), client)({"id": 1, "value": 3, "extra": True}, CONTEXT),
    ]
    decoder = RegistryDecoder(JsonSchemaReader, {"url": registry.url}, unknown_id_timeout_s=0)
    fixed = _decode(decoder, values[:1]).records
    assert fixed.schema.field("amount").type == pa.struct(
        [("currency", pa.string()), ("value", pa.float64())]
    )
    assert fixed.schema.field("note").type == pa.string()  # ["string", "null"]; absent here
    assert fixed.to_pylist()[0]["amount"] == {"currency": "EUR", "value": 3.0}
    huge = _decode(decoder, [JSONSerializer(closed, client)({**payment, "id": 2**70}, CONTEXT)])
    assert huge.failures == [] and huge.lossy == {"id"}  # beyond int64: the values type the columns
    assert huge.records.column("id").to_pylist() == [str(2**70)]
    inferred = _decode(decoder, values[1:]).records
    assert inferred.to_pylist() == [{"id": 1, "value": 3, "extra": True}]
    assert inferred.schema.field("value").type == pa.int64()


def test_json_schema_to_arrow() -> None:
    def arrow(schema: dict[str, Any]) -> pa.Schema | None:
        root = Resource.from_contents(schema, default_specification=DRAFT7)
        return json_schema_to_arrow(schema, referencing.Registry().resolver_with_root(root))

    closed = {
        "type": "object",
        "additionalProperties": False,
        "definitions": {"tag": {"type": "string"}},
        "properties": {
            "n": {"type": ["integer", "null"]},
            "tags": {"type": "array", "items": {"$ref": "#/definitions/tag"}},
        },
    }
    assert arrow(closed) == pa.schema([("n", pa.int64()), ("tags", pa.list_(pa.string()))])
    for open_part in (
        {"type": ["integer", "string"]},
        {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        {"type": "object", "properties": {"a": {"type": "string"}}},  # open: extra fields kept
        {"type": "array", "items": [{"type": "string"}]},  # a tuple
        {"$ref": "#/definitions/missing"},
    ):
        assert arrow({**closed, "properties": {"x": open_part}}) is None, open_part
    assert arrow({"type": "array", "items": {"type": "string"}}) is None  # not an object


def test_errors_tolerance_none_names_the_record(
    registry: Registry,
    classes: dict[str, Any],
    catalog_settings: CatalogSettings,
    catalog: Any,
    registry_clock: FakeClock,
) -> None:
    """An unreadable value stops the slice with the record's topic/partition/offset and the reason."""
    config = parse_config(
        {
            "name": "pb",
            "catalog": catalog_settings.model_dump(),
            "source": {
                "topics": ["t"],
                "format": "confluent-protobuf",
                "schema-registry": {"url": registry.url},
                "unknown-schema-id-timeout": "0s",
            },
            "tables": {"raw.wide": {}},
            "errors": {"tolerance": "none"},
        },
        "pb",
    )
    good = _serializer(registry, classes["Wide"])(classes["Wide"](big=1))
    process = build_processor(config, catalog)
    with pytest.raises(RecordError) as caught:
        process(make_raw_slice([good, wire(99, b"\x00")], topic="t", partition=2, start_offset=40))
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == ("t", 2, 41)
    assert caught.value.stage == "decode" and "unknown schema id 99" in str(caught.value)
