"""Schema Registry Protobuf and JSON Schema values -> records, with confluent-kafka's deserializers.

``source.format: confluent-protobuf`` and ``confluent-json-schema`` are the Confluent wire format
(magic byte, schema id; for Protobuf the message index path too) that the registry's serializers
write. The values are read by confluent-kafka's own ``ProtobufDeserializer`` and
``JSONDeserializer`` machinery, never by hand: the wire header, the writer schema looked up by id,
its **references** (imports of other registered subjects) resolved, JSON Schema validation.

``ProtobufDeserializer`` can only parse into the generated class it is given, and the sink knows no
producer's classes: :class:`_WriterProtobufDeserializer` reuses the deserializer's own steps (wire
header, writer schema, descriptor pool with the references, message index path) and parses into a
class made from the writer's descriptor. ``JSONDeserializer`` needs no class: with no reader schema
it validates against the writer schema and returns the object.

A reader returns, per value, a key (the writer schema, and for Protobuf the message type) and a
record (a dict of Python values), and ``arrow_schema(key)`` the columns the writer schema fixes, so
every batch of one writer schema has the same columns: for Protobuf from the descriptor, for JSON
Schema when the schema fixes them (:func:`json_schema_to_arrow`); otherwise the values type the
columns, as for ``format: json``.
"""

from __future__ import annotations

import io
import json
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa

with warnings.catch_warnings(record=True):  # authlib (the registry client's) warns about httpx on stderr
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.common._httpx_compat import httpx as http
    from confluent_kafka.schema_registry.common.json_schema import DEFAULT_SPEC
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.schema_registry.serde import SchemaId
from google.protobuf import empty_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from referencing import Resource

from fanout_sink.errors import SchemaError


class _Undecodable(Exception):
    """A value that is not a record of the writer schema; the message is the dead letter's reason."""


_NO_SUBJECT: dict[str, Any] = {"subject.name.strategy": lambda ctx, record_name: None}
"""Deserializer config: read with the writer schema only (no subject lookup, no latest version)."""

_NOT_WIRE = "not Confluent wire format (magic byte, schema id); is source.format right?"


class _RegistrySchemas:
    """Writer schemas by id, checked for their type and made usable once (references fetched).

    Registry outages raise :class:`SchemaError` (the sink stops and retries rather than
    dead-lettering good records): the client raises ``SchemaRegistryError`` for an HTTP error answer
    and its HTTP library's ``HTTPError`` (httpx or httpx2, whichever confluent-kafka picked) when
    there is no answer. An unknown id or an unusable schema is the reason every value naming it is
    dead-lettered, remembered per id.
    """

    def __init__(
        self, client: SchemaRegistryClient, schema_type: str, prepare: Callable[[int, Any], None]
    ) -> None:
        self._client = client
        self._type = schema_type
        self._prepare = prepare
        self._ready: dict[int, str | None] = {}
        self._lock = threading.Lock()

    def problem(self, schema_id: int) -> str | None:
        """Why values with ``schema_id`` cannot be read, or None when they can."""
        with self._lock:
            if schema_id in self._ready:
                return self._ready[schema_id]
        fmt = "serialized" if self._type == "PROTOBUF" else None
        try:
            schema = self._client.get_schema(schema_id, fmt=fmt)
        except (SchemaRegistryError, http.HTTPError) as exc:
            _missing(exc, f"schema id {schema_id}")
            problem: str | None = (
                f"unknown schema id {schema_id} in the Schema Registry; "
                "check source.schema-registry.url points at the producer's registry"
            )
        else:
            problem = self._usable(schema_id, schema)
        with self._lock:
            self._ready[schema_id] = problem
        return problem

    def _usable(self, schema_id: int, schema: Any) -> str | None:
        kind = str(schema.schema_type or "AVRO")
        if kind != self._type:
            return f"schema id {schema_id} is {kind}, not {self._type}; is source.format right?"
        try:
            self._prepare(schema_id, schema)
        except (SchemaRegistryError, http.HTTPError) as exc:
            _missing(exc, f"the references of schema id {schema_id}")
            return f"schema id {schema_id} references a schema the registry does not have: {exc}"
        except Exception as exc:  # a registered schema the libraries cannot build: many types
            return f"schema id {schema_id} cannot be used: {type(exc).__name__}: {exc}"
        return None


def _missing(exc: Exception, what: str) -> None:
    """Returns when the registry answered 404 (the schema is not there); raises
    :class:`SchemaError` when it could not answer (down, refused the credentials)."""
    if isinstance(exc, SchemaRegistryError) and exc.http_status_code == 404:
        return
    raise SchemaError(
        f"Schema Registry lookup of {what} failed: {type(exc).__name__}: {exc}\n"
        "  fix: check source.schema-registry.url and its credentials, and that the registry is up; "
        "nothing of the batch was committed, so a restarted sink reads it again"
    ) from exc


def _wire_header(value: bytes, schema_type: str) -> tuple[int, SchemaId, io.BytesIO]:
    """The wire header read by confluent-kafka's parser: (schema id, the parsed header with its
    message indexes, the payload after it)."""
    schema_id = SchemaId(schema_type)
    try:
        payload = schema_id.from_bytes(io.BytesIO(value))
    except Exception:  # short value, bad magic byte, bad message index varint
        raise _Undecodable(_NOT_WIRE) from None
    if schema_id.id is None:
        raise _Undecodable(f"{_NOT_WIRE} (a schema GUID header is not supported)")
    return int(schema_id.id), schema_id, payload


# --------------------------------------------------------------------------------------------
# Protobuf


class _WriterProtobufDeserializer(ProtobufDeserializer):  # type: ignore[misc]
    """``ProtobufDeserializer`` parsing into a class made from the writer's descriptor.

    The base class parses every value into its ``message_type`` (a generated class); here the
    placeholder ``Empty`` is never used to parse. :meth:`message` takes the base class's own
    steps: wire header with message indexes, writer schema by id, descriptor pool with the
    references resolved (``_get_parsed_schema``), message by index path (``_get_message_desc``).
    """

    def __init__(self, client: SchemaRegistryClient) -> None:
        super().__init__(empty_pb2.Empty, dict(_NO_SUBJECT), client)
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}

    def prepare(self, schema_id: int, schema: Any) -> None:
        """Build the writer schema's descriptor pool (fetching its references) once."""
        self._get_parsed_schema(schema)

    def message(self, schema_id: int, header: SchemaId, payload: io.BytesIO) -> Message:
        key = (schema_id, tuple(header.message_indexes or [0]))
        cls = self._classes.get(key)
        if cls is None:  # once per message type: finding it copies the whole file descriptor
            writer = self._get_writer_schema(header, None, fmt="serialized")
            fd_proto, pool = self._get_parsed_schema(writer)
            desc = self._get_message_desc(pool, pool.FindFileByName(fd_proto.name), list(key[1]))
            cls = self._classes[key] = GetMessageClass(desc)
        message = cls()
        message.ParseFromString(payload.read())
        return message


_INT64_MAX = 2**63 - 1
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {
    f"google.protobuf.{name}"
    for name in (
        "DoubleValue",
        "FloatValue",
        "Int64Value",
        "UInt64Value",
        "Int32Value",
        "UInt32Value",
        "BoolValue",
        "StringValue",
        "BytesValue",
    )
}
_AS_JSON = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
"""Free-form (recursive) types: a column of JSON text."""

_F = FieldDescriptor
_SCALARS: dict[int, pa.DataType] = {
    _F.TYPE_DOUBLE: pa.float64(),
    _F.TYPE_FLOAT: pa.float32(),
    _F.TYPE_INT64: pa.int64(),
    _F.TYPE_SINT64: pa.int64(),
    _F.TYPE_SFIXED64: pa.int64(),
    _F.TYPE_UINT64: pa.int64(),  # Iceberg has no unsigned types; a value beyond int64 is dead-lettered
    _F.TYPE_FIXED64: pa.int64(),
    _F.TYPE_INT32: pa.int32(),
    _F.TYPE_SINT32: pa.int32(),
    _F.TYPE_SFIXED32: pa.int32(),
    _F.TYPE_UINT32: pa.int64(),
    _F.TYPE_FIXED32: pa.int64(),
    _F.TYPE_BOOL: pa.bool_(),
    _F.TYPE_STRING: pa.string(),
    _F.TYPE_BYTES: pa.binary(),
    _F.TYPE_ENUM: pa.string(),
}

Convert = Callable[[Any], Any]
"""One protobuf value (a field's singular value, or a message) -> its Python record value."""


def _json_text(message: Message) -> str:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"))


class _Shapes:
    """Arrow types and value converters of message types, made once per descriptor.

    A message type that contains itself (a tree) cannot be an Arrow struct: below its first level
    it is kept as JSON text, as are ``Struct``/``Value``/``ListValue``.
    """

    def __init__(self) -> None:
        self._types: dict[tuple[Descriptor, frozenset[str]], tuple[pa.DataType, Convert]] = {}

    def message(self, desc: Descriptor, outer: frozenset[str] = frozenset()) -> tuple[pa.DataType, Convert]:
        """The Arrow type of ``desc`` and the converter of its messages (``outer``: enclosing types)."""
        key = (desc, outer)
        found = self._types.get(key)
        if found is not None:
            return found
        name = desc.full_name
        shape: tuple[pa.DataType, Convert]
        if name == _TIMESTAMP:
            shape = pa.timestamp("us", tz="UTC"), lambda m: m.seconds * 1_000_000 + m.nanos // 1000
        elif name in _WRAPPERS:
            dtype, unwrap = self._singular(desc.fields_by_name["value"], outer)
            shape = dtype, lambda m: unwrap(m.value)
        elif name in _AS_JSON or name in outer:
            shape = pa.string(), _json_text
        else:
            inner = outer | {name}
            fields: list[pa.Field] = []
            converters: list[tuple[str, Callable[[Message], Any]]] = []
            for field in desc.fields:
                dtype, convert = self.field(field, inner)
                fields.append(pa.field(field.name, dtype, nullable=_nullable(field)))
                converters.append((field.name, convert))

            def record(message: Message) -> dict[str, Any]:
                return {name: convert(message) for name, convert in converters}

            shape = pa.struct(fields), record
        self._types[key] = shape
        return shape

    def field(
        self, field: FieldDescriptor, outer: frozenset[str]
    ) -> tuple[pa.DataType, Callable[[Message], Any]]:
        """The Arrow type of ``field`` and a function reading it from its message."""
        name = field.name
        if field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key_type, key_of = self._singular(field.message_type.fields_by_name["key"], outer)
            item_type, item_of = self._singular(field.message_type.fields_by_name["value"], outer)

            def entries(message: Message) -> list[tuple[Any, Any]]:
                return [(key_of(k), item_of(v)) for k, v in getattr(message, name).items()]

            return pa.map_(key_type, item_type), entries
        dtype, convert = self._singular(field, outer)
        if field.is_repeated:
            return pa.list_(dtype), lambda m: [convert(v) for v in getattr(m, name)]
        if field.has_presence:
            return dtype, lambda m: convert(getattr(m, name)) if m.HasField(name) else None
        return dtype, lambda m: convert(getattr(m, name))

    def _singular(self, field: FieldDescriptor, outer: frozenset[str]) -> tuple[pa.DataType, Convert]:
        if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
            return self.message(field.message_type, outer)
        if field.type == _F.TYPE_ENUM:
            names = {v.number: v.name for v in field.enum_type.values}
            return pa.string(), lambda number: names.get(number, str(number))
        if field.type in (_F.TYPE_UINT64, _F.TYPE_FIXED64):
            return pa.int64(), _fits_int64(field.full_name)
        return _SCALARS[field.type], _same


def _same(value: Any) -> Any:
    return value


def _fits_int64(field: str) -> Convert:
    def check(value: int) -> int:
        if value > _INT64_MAX:
            raise _Undecodable(f"{field} = {value} does not fit a 64-bit signed integer column")
        return value

    return check


def _nullable(field: FieldDescriptor) -> bool:
    """Null only where protobuf tracks presence (messages, ``optional``, oneof members, wrappers):
    a proto3 scalar without ``optional`` always has a value (its default when not sent)."""
    if field.is_repeated:
        return False
    return bool(field.has_presence)


class _Reader:
    """:meth:`read`: a value's (key, record), or the reason it cannot be read."""

    def read(self, value: bytes) -> tuple[Hashable, dict[str, Any]] | str:
        try:
            return self._read(value)
        except _Undecodable as exc:
            return str(exc)

    def _read(self, value: bytes) -> tuple[Hashable, dict[str, Any]]:
        raise NotImplementedError


class ProtobufReader(_Reader):
    """Confluent wire-format Protobuf values -> records, one key per (schema id, message type)."""

    def __init__(self, registry_conf: dict[str, str]) -> None:
        client = SchemaRegistryClient(dict(registry_conf))
        self._deserializer = _WriterProtobufDeserializer(client)
        self._schemas = _RegistrySchemas(client, "PROTOBUF", self._deserializer.prepare)
        self._shapes = _Shapes()

    def _read(self, value: bytes) -> tuple[Hashable, dict[str, Any]]:
        schema_id, header, payload = _wire_header(value, "PROTOBUF")
        problem = self._schemas.problem(schema_id)
        if problem is not None:
            raise _Undecodable(problem)
        try:
            message = self._deserializer.message(schema_id, header, payload)
        except Exception as exc:  # DecodeError, bad message index, invalid UTF-8 in a string: many types
            raise _Undecodable(
                f"invalid Protobuf for schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        desc = message.DESCRIPTOR
        record: dict[str, Any] = self._shapes.message(desc)[1](message)
        return desc, record

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        assert isinstance(key, Descriptor)
        dtype = self._shapes.message(key)[0]
        return pa.schema(list(dtype))


# --------------------------------------------------------------------------------------------
# JSON Schema


class _WriterJsonDeserializer(JSONDeserializer):  # type: ignore[misc]
    """``JSONDeserializer`` with no reader schema (it validates against the writer schema), whose
    writer schema and references can be fetched ahead of the values (:meth:`prepare`)."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        super().__init__(None, schema_registry_client=client, conf=dict(_NO_SUBJECT))
        self.arrow_schemas: dict[int, pa.Schema | None] = {}

    def prepare(self, schema_id: int, schema: Any) -> None:
        parsed, references = self._get_parsed_schema(schema)
        if references is not None:  # None only for a schema given to the constructor, never here
            root = Resource.from_contents(parsed, default_specification=DEFAULT_SPEC)
            self.arrow_schemas[schema_id] = json_schema_to_arrow(parsed, references.resolver_with_root(root))


_JSON_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}
_MAX_DEPTH = 32


def json_schema_to_arrow(schema: Any, resolver: Any) -> pa.Schema | None:
    """The columns a JSON Schema fixes, or None when its values must type the columns.

    Fixed only for a closed object (``additionalProperties: false``, so no field is dropped) whose
    properties all have one plain type: ``integer`` (long), ``number`` (double, even for whole
    values), ``string`` (``format`` aside: timestamps are converted per table column), ``boolean``,
    closed objects (structs), ``array`` of one ``items`` schema, a ``[T, "null"]`` type list, and
    ``$ref`` to any of these (in the schema or a reference). Anything else (``oneOf`` of different
    types, open objects, ``allOf``) and the values type the columns, as for ``format: json``.
    """
    dtype = _json_type(schema, resolver, 0)
    if dtype is None or not pa.types.is_struct(dtype):
        return None
    return pa.schema(list(dtype))


def _json_type(schema: Any, resolver: Any, depth: int) -> pa.DataType | None:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "$ref" in schema:
        try:
            resolved = resolver.lookup(schema["$ref"])
        except Exception:  # an unresolvable reference: the validator reports it per value
            return None
        return _json_type(resolved.contents, resolved.resolver, depth + 1)
    if any(k in schema for k in ("allOf", "anyOf", "oneOf", "not", "if")):
        return None
    kinds = schema.get("type")
    if isinstance(kinds, list):
        plain = [k for k in kinds if k != "null"]
        if len(plain) != 1:
            return None
        kinds = plain[0]
    if kinds in _JSON_SCALARS:
        return _JSON_SCALARS[kinds]
    if kinds == "array" and isinstance(schema.get("items"), dict):
        item = _json_type(schema["items"], resolver, depth + 1)
        return None if item is None else pa.list_(item)
    if kinds == "object" and schema.get("additionalProperties") is False:
        if schema.get("patternProperties"):
            return None
        fields = []
        for name, sub in (schema.get("properties") or {}).items():
            dtype = _json_type(sub, resolver, depth + 1)
            if dtype is None:
                return None
            fields.append(pa.field(name, dtype))
        return pa.struct(fields) if fields else None
    return None


class JsonSchemaReader(_Reader):
    """Confluent wire-format JSON Schema values -> records, validated against the writer schema."""

    def __init__(self, registry_conf: dict[str, str]) -> None:
        client = SchemaRegistryClient(dict(registry_conf))
        self._deserializer = _WriterJsonDeserializer(client)
        self._schemas = _RegistrySchemas(client, "JSON", self._deserializer.prepare)

    def _read(self, value: bytes) -> tuple[Hashable, dict[str, Any]]:
        schema_id = _wire_header(value, "JSON")[0]
        problem = self._schemas.problem(schema_id)
        if problem is not None:
            raise _Undecodable(problem)
        try:
            record = self._deserializer(value, None)
        except Exception as exc:  # invalid JSON, fails validation: SerializationError, ValueError, ...
            raise _Undecodable(
                f"invalid JSON Schema value for schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise _Undecodable(f"value for schema id {schema_id} is a JSON {kind}, not an object")
        return schema_id, record

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        """The writer schema's columns when it fixes them (:func:`json_schema_to_arrow`); None:
        the columns are built from the values, as for ``format: json``."""
        assert isinstance(key, int)
        return self._deserializer.arrow_schemas.get(key)


def registry_reader(source_format: str, registry_conf: dict[str, str]) -> ProtobufReader | JsonSchemaReader:
    """The reader of a ``source.format`` that the registry's Protobuf or JSON Schema serializers wrote."""
    if source_format == "confluent-protobuf":
        return ProtobufReader(registry_conf)
    if source_format == "confluent-json-schema":
        return JsonSchemaReader(registry_conf)
    raise ValueError(f"no Schema Registry reader for format {source_format!r}")
