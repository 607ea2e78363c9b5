"""The reader of ``format: confluent-protobuf``: registry Protobuf values -> records.

``ProtobufDeserializer`` can only parse into the generated class it is given, and the sink knows no
producer's classes: :class:`_WriterProtobufDeserializer` reuses the deserializer's own steps (wire
header, writer schema, descriptor pool with the references, message index path) and parses into a
class made from the writer's descriptor. The registry path
(:mod:`~fanout_sink.transform.formats.registry`) has checked the header and the writer schema;
:class:`ProtobufReader` reads the message index path and the message, and gives one key per
(schema id, message type), whose columns the descriptor fixes (:class:`_Shapes`).
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

import pyarrow as pa

with warnings.catch_warnings(record=True):  # authlib (the registry client's) warns about httpx on stderr
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.schema_registry.serde import SchemaId
from google.protobuf import empty_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from fanout_sink.transform.formats.decoded import Undecodable
from fanout_sink.transform.formats.registry import NOT_WIRE_FORMAT, WRITER_SCHEMA_ONLY


class _WriterProtobufDeserializer(ProtobufDeserializer):  # type: ignore[misc]
    """``ProtobufDeserializer`` parsing into a class made from the writer's descriptor.

    The base class parses every value into its ``message_type`` (a generated class); here the
    placeholder ``Empty`` is never used to parse. :meth:`message` takes the base class's own
    steps: wire header with message indexes, writer schema by id, descriptor pool with the
    references resolved (``_get_parsed_schema``), message by index path (``_get_message_desc``).
    """

    def __init__(self, client: SchemaRegistryClient) -> None:
        super().__init__(empty_pb2.Empty, dict(WRITER_SCHEMA_ONLY), client)
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}

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
            raise Undecodable(f"{field} = {value} does not fit a 64-bit signed integer column")
        return value

    return check


def _nullable(field: FieldDescriptor) -> bool:
    """Null only where protobuf tracks presence (messages, ``optional``, oneof members, wrappers):
    a proto3 scalar without ``optional`` always has a value (its default when not sent)."""
    if field.is_repeated:
        return False
    return bool(field.has_presence)


class ProtobufReader:
    """Confluent wire-format Protobuf values -> records, one key per (schema id, message type)."""

    schema_type: ClassVar[str] = "PROTOBUF"
    schema_format: ClassVar[str | None] = "serialized"
    python_view: ClassVar[bool] = False

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._deserializer = _WriterProtobufDeserializer(client)
        self._shapes = _Shapes()

    def prepare(self, schema_id: int, schema: Any) -> None:
        """Build the writer schema's descriptor pool (fetching its references) once."""
        self._deserializer._get_parsed_schema(schema)

    def framed(self, value: bytes) -> tuple[SchemaId, io.BytesIO]:
        """The header with its message index path (read by confluent-kafka's parser) and the
        message bytes after it."""
        header = SchemaId("PROTOBUF")
        try:
            payload = header.from_bytes(io.BytesIO(value))
        except Exception:  # a bad message index varint
            raise Undecodable(NOT_WIRE_FORMAT) from None
        return header, payload

    def read(self, schema_id: int, framed: tuple[SchemaId, io.BytesIO]) -> tuple[Hashable, dict[str, Any]]:
        header, payload = framed
        try:
            message = self._deserializer.message(schema_id, header, payload)
        except Exception as exc:  # DecodeError, bad message index, invalid UTF-8 in a string: many types
            raise Undecodable(
                f"invalid Protobuf for schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        desc = message.DESCRIPTOR
        record: dict[str, Any] = self._shapes.message(desc)[1](message)
        return desc, record

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        assert isinstance(key, Descriptor)
        dtype = self._shapes.message(key)[0]
        return pa.schema(list(dtype))
