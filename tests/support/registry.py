"""A minimal Confluent Schema Registry: the real HTTP API on a local port.

There is no Schema Registry on the test machines; confluent-kafka's ``SchemaRegistryClient`` (and its
Avro, Protobuf and JSON Schema serializers and deserializers) talks to this one over real HTTP, so
its error handling (404 -> unknown id) is exercised as in production.

Served, as Confluent's REST API does: ``GET /schemas/ids/<id>`` and ``GET /subjects/<s>/versions/<v>``
(``v`` a number or ``latest``) with ``schemaType`` (left out for AVRO, as the real registry does) and
``references``; ``POST /subjects/<s>/versions`` (register: the same schema under the same subject
keeps its id and version) and ``POST /subjects/<s>`` (look up). Schemas are stored verbatim: the
Protobuf serializer registers base64 ``FileDescriptorProto`` text and asks for
``?format=serialized``, which is what it gets back; the real registry converts ``.proto`` text too.
"""

from __future__ import annotations

import json
import struct
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message


@dataclass(frozen=True)
class _Entry:
    schema: str
    schema_type: str
    references: tuple[tuple[str, str, int], ...]  # (name, subject, version)

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            body["schemaType"] = self.schema_type
        if self.references:
            body["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in self.references]
        return body


def _entry(request: dict[str, Any]) -> _Entry:
    references = tuple(
        (str(r["name"]), str(r["subject"]), int(r["version"])) for r in request.get("references") or []
    )
    return _Entry(str(request["schema"]), str(request.get("schemaType") or "AVRO"), references)


class Registry:
    """A minimal Schema Registry HTTP endpoint for the real client to call.

    ``schemas`` preloads Avro schemas by id (the id is what a test's wire-format values name).
    """

    def __init__(self, schemas: dict[int, dict[str, Any]] | None = None) -> None:
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._by_id: dict[int, _Entry] = {
            i: _Entry(json.dumps(s), "AVRO", ()) for i, s in (schemas or {}).items()
        }
        self._subjects: dict[str, list[int]] = {}  # subject -> schema id of each version (1-based)
        self._misses: dict[int, int] = {}  # schema id -> 404 answers still owed (a lagging follower)
        self._hidden: set[int] = set()  # ids answered 404 until revealed (a follower seconds behind)
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append(self.path)
                self._answer(registry.get(self._parts()))

            def do_POST(self) -> None:
                registry.requests.append(f"POST {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                self._answer(registry.post(self._parts(), request))

            def _parts(self) -> list[str]:
                return [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]

            def _answer(self, found: dict[str, Any] | None) -> None:
                if found is None:
                    found = {"error_code": 40403, "message": "Schema not found"}
                    self.send_response(404)
                else:
                    self.send_response(200)
                body = json.dumps(found).encode()
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, in every test's teardown
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def register(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: list[dict[str, Any]] | None = None,
    ) -> int:
        """Register ``schema`` under ``subject`` (as ``POST /subjects/<s>/versions``); its id."""
        return self._register(
            subject, _entry({"schema": schema, "schemaType": schema_type, "references": references})
        )

    def _register(self, subject: str, entry: _Entry) -> int:
        with self._lock:
            schema_id = next((i for i, e in self._by_id.items() if e == entry), None)
            if schema_id is None:
                schema_id = max(self._by_id, default=0) + 1
                self._by_id[schema_id] = entry
            versions = self._subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id

    def _version(self, subject: str, schema_id: int) -> dict[str, Any]:
        version = self._subjects[subject].index(schema_id) + 1
        return {"subject": subject, "version": version, "id": schema_id, **self._by_id[schema_id].body()}

    def publish(self, schema_id: int, schema: dict[str, Any]) -> None:
        """Serve an Avro schema under ``schema_id`` from now on (a registry restored or caught up)."""
        with self._lock:
            self._by_id[schema_id] = _Entry(json.dumps(schema), "AVRO", ())

    def lag(self, schema_id: int, misses: int) -> None:
        """Answer 404 to the next ``misses`` look-ups of ``schema_id``, as a follower that has not
        replicated the schema yet does, then serve it."""
        with self._lock:
            self._misses[schema_id] = misses

    def hide(self, schema_id: int) -> None:
        """Answer 404 to every look-up of ``schema_id`` until :meth:`reveal`: a producer registered it
        on another node, and this one has not replicated it yet (however often it is asked)."""
        with self._lock:
            self._hidden.add(schema_id)

    def reveal(self, schema_id: int) -> None:
        """Serve ``schema_id`` from now on (replication caught up)."""
        with self._lock:
            self._hidden.discard(schema_id)

    def get(self, parts: list[str]) -> dict[str, Any] | None:
        with self._lock:
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                schema_id = int(parts[2])
                if schema_id in self._hidden:
                    return None
                if self._misses.get(schema_id, 0) > 0:
                    self._misses[schema_id] -= 1
                    return None
                entry = self._by_id.get(schema_id)
                return None if entry is None else entry.body()
            if len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
                versions = self._subjects.get(parts[1], [])
                if parts[3] == "latest" and versions:
                    return self._version(parts[1], versions[-1])
                if parts[3].isdigit() and 0 < int(parts[3]) <= len(versions):
                    return self._version(parts[1], versions[int(parts[3]) - 1])
            return None

    def post(self, parts: list[str], request: dict[str, Any]) -> dict[str, Any] | None:
        if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            return {"id": self._register(parts[1], _entry(request))}
        if len(parts) == 2 and parts[0] == "subjects":
            entry = _entry(request)
            with self._lock:
                for schema_id in self._subjects.get(parts[1], []):
                    if self._by_id[schema_id] == entry:
                        return self._version(parts[1], schema_id)
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeClock:
    """A clock whose sleeps advance it at once and are summed: the registry module's own and its
    unknown-id wait's in tests (``registry_clock``, tests/transform/conftest.py), which count the
    seconds a decode would wait for an id the registry does not know instead of waiting them."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.slept = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def wire(schema_id: int, payload: bytes) -> bytes:
    """Confluent wire format: magic byte 0, the 4-byte big-endian schema id, then the Avro body."""
    return b"\x00" + struct.pack(">I", schema_id) + payload


def compile_protos(root: Path, *files: str) -> descriptor_pool.DescriptorPool:
    """``files`` (relative to ``root``) compiled by protoc, as a producer's build does, into a pool
    with their imports: the test's stand-in for a producer's generated classes."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        include = resources.files("grpc_tools") / "_proto"
        argv = ["protoc", f"-I{root}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports"]
        if protoc.main([*argv, *files]) != 0:
            raise RuntimeError(f"protoc failed on {files}")
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptors.file:
        pool.Add(file)
    return pool


def message_class(pool: descriptor_pool.DescriptorPool, name: str) -> type[Message]:
    """The class of message type ``name`` (e.g. ``shop.Order``) in ``pool``."""
    cls: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return cls
