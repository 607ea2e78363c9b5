"""Decoders: batch JSON, Avro with a schema file, Confluent wire-format Avro via a registry."""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from fanout_sink.decode import AvroDecoder, ConfluentAvroDecoder, JsonDecoder, avro_to_arrow_schema

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
        "ts": datetime(2024, 5, 1, tzinfo=timezone.utc),
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
    assert reasons[2] == "value is a JSON list, not an object"
    assert reasons[5] == "value is a JSON int, not an object"


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


class _Registry:
    """A minimal Schema Registry HTTP endpoint (GET /schemas/ids/<id>) for the real client to call."""

    def __init__(self, schemas: dict[int, dict[str, Any]]) -> None:
        self.schemas = schemas
        self.requests: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append(self.path)
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) >= 3 and parts[:2] == ["schemas", "ids"] and int(parts[2]) in registry.schemas:
                    body = json.dumps({"schema": json.dumps(registry.schemas[int(parts[2])])}).encode()
                    self.send_response(200)
                else:
                    body = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
                    self.send_response(404)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry() -> Iterator[_Registry]:
    reg = _Registry({7: ORDER_SCHEMA})
    yield reg
    reg.close()


def _wire(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def test_confluent_avro_resolves_and_caches_schema(registry: _Registry) -> None:
    decoder = ConfluentAvroDecoder({"url": registry.url})
    values = pa.array(
        [
            _wire(7, _avro(ORDER_SCHEMA, _order(1))),
            b"\x01plain",
            _wire(99, b"\x00"),
            _wire(7, _avro(ORDER_SCHEMA, _order(2))),
        ]
    )
    decoded = decoder(values)
    assert decoded.rows.tolist() == [0, 3]
    assert decoded.records.column("id").to_pylist() == [1, 2]
    reasons = dict(decoded.failures)
    assert "not Confluent wire format" in reasons[1]
    assert reasons[2].startswith("unknown schema id 99 in the Schema Registry")
    asked = len(registry.requests)
    decoder(pa.array([_wire(7, _avro(ORDER_SCHEMA, _order(3)))]))
    assert len(registry.requests) == asked  # cached per id
