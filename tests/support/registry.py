"""A minimal Confluent Schema Registry: the real HTTP API (``GET /schemas/ids/<id>``) on a local port.

There is no Schema Registry on the test machines; confluent-kafka's ``SchemaRegistryClient`` talks
to this one over real HTTP, so its error handling (404 -> unknown id) is exercised as in production.
"""

from __future__ import annotations

import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Registry:
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


def wire(schema_id: int, payload: bytes) -> bytes:
    """Confluent wire format: magic byte 0, the 4-byte big-endian schema id, then the Avro body."""
    return b"\x00" + struct.pack(">I", schema_id) + payload
