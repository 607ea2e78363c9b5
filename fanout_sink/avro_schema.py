"""Avro record schemas as Arrow schemas.

An ``.avsc`` file can describe a table (``tables.<name>.schema``) or the writer schema of the source
records (``source.schema``), and the Schema Registry hands out the same kind of schema. One mapping
serves config validation, table creation and Avro decoding, so a schema accepted at load time is
the one the tables and decoders get.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout_sink.errors import SchemaError

CONNECT_NAME = b"connect.name"
"""Arrow field metadata key: the Kafka Connect logical type an Avro field is annotated with
(``"connect.name": "io.debezium.time.Date"`` on a plain ``int``, as Connect's AvroConverter writes
Debezium's types). The field keeps its Avro type; :mod:`fanout_sink.transform.debezium` reads it."""


def avro_to_arrow_type(schema: Any, named: dict[str, pa.DataType] | None = None) -> tuple[pa.DataType, bool]:
    """Arrow type of a (fastavro-parsed or JSON) Avro schema and whether it is nullable."""
    named = {} if named is None else named
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaError(
                f"Avro union {schema} has several non-null branches; only [null, T] unions are supported"
            )
        dtype, _ = avro_to_arrow_type(branches[0], named)
        return dtype, True
    if isinstance(schema, str):
        primitive = {
            "null": pa.null(),
            "boolean": pa.bool_(),
            "int": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "bytes": pa.binary(),
            "string": pa.string(),
        }
        if schema in primitive:
            return primitive[schema], schema == "null"
        if schema in named:
            return named[schema], False
        raise SchemaError(f"unknown Avro type {schema!r}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0))), False
    if logical == "date":
        return pa.date32(), False
    if logical == "time-millis":
        return pa.time32("ms"), False
    if logical == "time-micros":
        return pa.time64("us"), False
    if logical in {"timestamp-millis", "timestamp-micros"}:
        return pa.timestamp("us", tz="UTC"), False
    if logical in {"local-timestamp-millis", "local-timestamp-micros"}:
        return pa.timestamp("us"), False
    if logical == "uuid":
        return pa.string(), False
    if kind == "record":
        fields = []
        for f in schema["fields"]:
            dtype, nullable = avro_to_arrow_type(f["type"], named)
            fields.append(pa.field(f["name"], dtype, nullable=nullable, metadata=_connect_name(f["type"])))
        struct = pa.struct(fields)
        _name(named, schema, struct)
        return struct, False
    if kind == "enum":
        _name(named, schema, pa.string())
        return pa.string(), False
    if kind == "fixed":
        dtype = pa.binary(int(schema["size"]))
        _name(named, schema, dtype)
        return dtype, False
    if kind == "array":
        item, nullable = avro_to_arrow_type(schema["items"], named)
        return pa.list_(pa.field("element", item, nullable=nullable)), False
    if kind == "map":
        item, nullable = avro_to_arrow_type(schema["values"], named)
        return pa.map_(pa.string(), pa.field("value", item, nullable=nullable)), False
    if isinstance(kind, str | list | dict):
        return avro_to_arrow_type(kind, named)
    raise SchemaError(f"unsupported Avro schema {schema!r}")


def _connect_name(schema: Any) -> dict[bytes, bytes] | None:
    """The Connect logical type of a field's (non-null) type that Avro itself leaves untyped."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        schema = branches[0] if len(branches) == 1 else None
    if (
        not isinstance(schema, dict)
        or "logicalType" in schema
        or not isinstance(schema.get("connect.name"), str)
    ):
        return None
    return {CONNECT_NAME: schema["connect.name"].encode()}


def _name(named: dict[str, pa.DataType], schema: dict[str, Any], dtype: pa.DataType) -> None:
    """A named type is referred to by its name or, with its namespace, its full name."""
    named[schema["name"]] = dtype
    if "namespace" in schema:
        named[f"{schema['namespace']}.{schema['name']}"] = dtype


def avro_to_arrow_schema(schema: dict[str, Any], named: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """``named``: Arrow types of named types defined elsewhere (a registry schema's references)."""
    dtype, _ = avro_to_arrow_type(schema, named)
    if not pa.types.is_struct(dtype):
        raise SchemaError("the Avro schema must be a record")
    return pa.schema(list(dtype))


def load_avro_schema(path: Path) -> dict[str, Any]:
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SchemaError(f"cannot read Avro schema {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SchemaError(f"Avro schema {path} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise SchemaError(f"Avro schema {path} must be a record schema object")
    return schema
