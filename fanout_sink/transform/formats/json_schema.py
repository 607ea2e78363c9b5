"""The reader of ``format: confluent-json-schema``: registry JSON Schema values -> records.

confluent-kafka's ``JSONDeserializer`` with no reader schema validates each value against its
writer schema (references resolved by the deserializer) and returns the object. The columns are
fixed by the writer schema when it fixes them (:func:`json_schema_to_arrow`); otherwise the values
type them, as for ``format: json``.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any, ClassVar

import pyarrow as pa

with warnings.catch_warnings(record=True):  # authlib (the registry client's) warns about httpx on stderr
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.common.json_schema import DEFAULT_SPEC
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from referencing import Resource

from fanout_sink.transform.formats.decoded import Undecodable
from fanout_sink.transform.formats.registry import WRITER_SCHEMA_ONLY

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


class JsonSchemaReader:
    """Confluent wire-format JSON Schema values -> records, validated against the writer schema."""

    schema_type: ClassVar[str] = "JSON"
    schema_format: ClassVar[str | None] = None
    python_view: ClassVar[bool] = False

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._deserializer = JSONDeserializer(
            None, schema_registry_client=client, conf=dict(WRITER_SCHEMA_ONLY)
        )
        self._arrow_schemas: dict[int, pa.Schema | None] = {}

    def prepare(self, schema_id: int, schema: Any) -> None:
        """Parse the writer schema with its references (fetched by the deserializer) once, and
        note the columns it fixes."""
        parsed, references = self._deserializer._get_parsed_schema(schema)
        if references is not None:  # None only for a schema given to the constructor, never here
            root = Resource.from_contents(parsed, default_specification=DEFAULT_SPEC)
            self._arrow_schemas[schema_id] = json_schema_to_arrow(parsed, references.resolver_with_root(root))

    def framed(self, value: bytes) -> bytes:
        """The value as it is: the deserializer reads its header (magic byte and schema id)."""
        return value

    def read(self, schema_id: int, framed: bytes) -> tuple[Hashable, dict[str, Any]]:
        try:
            record = self._deserializer(framed, None)
        except Exception as exc:  # invalid JSON, fails validation: SerializationError, ValueError, ...
            raise Undecodable(
                f"invalid JSON Schema value for schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise Undecodable(f"value for schema id {schema_id} is a JSON {kind}, not an object")
        return schema_id, record

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        """The writer schema's columns when it fixes them (:func:`json_schema_to_arrow`); None:
        the columns are built from the values, as for ``format: json``."""
        assert isinstance(key, int)
        return self._arrow_schemas.get(key)
