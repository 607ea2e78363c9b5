"""Decode throughput of the Schema Registry formats, one batch of N shop orders each.

    PYTHONPATH=. .venv/bin/python tests/support/bench_registry_formats.py [N]

Run from the repository root. The values are made by confluent-kafka's serializers against the
registry stand-in; each decoder is warmed on 10 values (schema fetched), then timed on all N.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.registry import Registry, compile_protos, message_class, wire

from fanout_sink.transform.formats.avro import AvroReader
from fanout_sink.transform.formats.decoded import Decoder
from fanout_sink.transform.formats.json_schema import JsonSchemaReader
from fanout_sink.transform.formats.protobuf import ProtobufReader
from fanout_sink.transform.formats.registry import RegistryDecoder

ROOT = Path(__file__).resolve().parents[2]
TS_MS = 1714557600000
AVRO = {
    "type": "record",
    "name": "O",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "customer",
            "type": {"type": "record", "name": "C", "fields": [{"name": "id", "type": "string"}]},
        },
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "L",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "quantity", "type": "int"}],
                },
            },
        },
        {"name": "status", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}

JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "object", "properties": {"id": {"type": "string"}}},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
            },
        },
        "status": {"type": "string"},
        "ts": {"type": "string", "format": "date-time"},
    },
}


def _record(i: int) -> dict[str, Any]:
    return {"id": i, "customer": {"id": f"c{i}"}, "lines": [{"sku": "A", "quantity": 2}], "status": "PLACED"}


def main(n: int) -> None:
    registry = Registry()
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext("orders", MessageField.VALUE)
    order_class = message_class(
        compile_protos(ROOT / "schemas" / "sources", "shop/order.proto"), "shop.Order"
    )
    to_protobuf = ProtobufSerializer(order_class, client, {"use.deprecated.format": False})
    avro_id = registry.register("orders-avro", json.dumps(AVRO))
    parsed = fastavro.parse_schema(AVRO)
    to_json = JSONSerializer(json.dumps(JSON_SCHEMA), client)

    def avro(i: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {**_record(i), "ts": (TS_MS + i) * 1000})
        return wire(avro_id, out.getvalue())

    def protobuf(i: int) -> bytes:
        message: Any = order_class(id=i, status=order_class.PLACED)
        message.customer.id = f"c{i}"
        message.lines.add(sku="A", quantity=2)
        message.ts.FromMilliseconds(TS_MS + i)
        return bytes(to_protobuf(message, context))

    cases: list[tuple[str, Decoder, list[bytes]]] = [
        (
            "confluent-avro",
            RegistryDecoder(AvroReader, {"url": registry.url}, unknown_id_timeout_s=0),
            [avro(i) for i in range(n)],
        ),
        (
            "confluent-protobuf",
            RegistryDecoder(ProtobufReader, {"url": registry.url}, unknown_id_timeout_s=0),
            [protobuf(i) for i in range(n)],
        ),
        (
            "confluent-json-schema",
            RegistryDecoder(JsonSchemaReader, {"url": registry.url}, unknown_id_timeout_s=0),
            [bytes(to_json({**_record(i), "ts": "2024-05-01T10:00:00Z"}, context)) for i in range(n)],
        ),
    ]
    for name, decoder, values in cases:
        batch = pa.array(values, pa.binary())
        decoder(batch[:10])
        start = time.perf_counter()
        decoded = decoder(batch)
        elapsed = time.perf_counter() - start
        assert decoded.records.num_rows == n and not decoded.failures
        print(f"{name:22s} {n / elapsed:10.0f} records/s  ({elapsed:.2f}s for {n})")
    registry.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
