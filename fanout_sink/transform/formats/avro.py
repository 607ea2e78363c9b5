"""Avro values -> records: ``format: avro`` and the reader of ``format: confluent-avro``.

``avro`` is schemaless Avro written with the one schema of an ``.avsc`` file (``source.schema``):
:class:`AvroDecoder`. ``confluent-avro`` is the Schema Registry's wire format; the registry path
(:mod:`~fanout_sink.transform.formats.registry`) reads the header and groups values by schema id,
and :class:`AvroReader` makes each writer schema usable (its references resolved by
confluent-kafka's ``AvroDeserializer``) and reads the bodies. Both read a body with
:func:`avro_record`, so a bad value gets the same reason either way.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
from fastavro import parse_schema, schemaless_reader

from fanout_sink.avro_schema import avro_to_arrow_schema
from fanout_sink.transform.formats.decoded import Decoded, FieldPaths, Undecodable, no_records

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient


def avro_record(value: bytes, schema: Any, skip: int = 0) -> dict[str, Any]:
    """The record in ``value`` after ``skip`` header bytes, read with the parsed writer ``schema``;
    raises :class:`Undecodable` with the dead letter's reason when it is not one."""
    stream = io.BytesIO(value)
    stream.seek(skip)
    try:
        obj = schemaless_reader(stream, schema, None)
    except Exception as exc:  # fastavro raises many types on bad input
        raise Undecodable(f"invalid Avro for the writer schema: {type(exc).__name__}: {exc}") from None
    if stream.tell() != len(value):
        raise Undecodable(f"invalid Avro: {len(value) - stream.tell()} trailing bytes")
    if not isinstance(obj, dict):
        raise Undecodable("Avro value is not a record")
    return obj


class AvroDecoder:
    """Schemaless Avro values written with one known schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = parse_schema(schema)
        self.arrow_schema = avro_to_arrow_schema(schema)

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """``fields`` is not needed: every value is decoded with its writer schema."""
        if len(values) == 0:
            return no_records()
        objects: list[dict[str, Any]] = []
        good: list[int] = []
        failures: list[tuple[int, str]] = []
        for index, value in enumerate(values.to_pylist()):
            if value is None:
                failures.append((index, "value is null"))
                continue
            try:
                objects.append(avro_record(value, self.schema))
            except Undecodable as exc:
                failures.append((index, str(exc)))
                continue
            good.append(index)
        table = pa.Table.from_pylist(objects, schema=self.arrow_schema)
        return Decoded(table, np.asarray(good, dtype=np.int64), failures, _python_cache=objects)


class AvroReader:
    """Confluent wire-format Avro bodies -> records, one key per schema id.

    The records are fastavro's (datetimes, ``Decimal``, maps as dicts): routing reads them as they
    are (:attr:`python_view`), and the writer schema's Arrow schema types the columns.
    """

    schema_type: ClassVar[str] = "AVRO"
    schema_format: ClassVar[str | None] = None
    python_view: ClassVar[bool] = True

    def __init__(self, client: SchemaRegistryClient) -> None:
        with warnings.catch_warnings(record=True):  # authlib (the registry client's) warns about httpx
            from confluent_kafka.schema_registry.avro import AvroDeserializer

        self._deserializer = AvroDeserializer(client)
        self._schemas: dict[int, tuple[Any, pa.Schema]] = {}

    def prepare(self, schema_id: int, schema: Any) -> None:
        """Parse the writer schema with its references (named types registered as their own
        subjects, fetched and resolved by ``AvroDeserializer``) and map it to Arrow, once per id."""
        parsed = self._deserializer._get_parsed_schema(schema)
        self._schemas[schema_id] = parsed, avro_to_arrow_schema(parsed)

    def framed(self, value: bytes) -> bytes:
        """The value as it is: Avro's header is the magic byte and schema id alone."""
        return value

    def read(self, schema_id: int, framed: bytes) -> tuple[Hashable, dict[str, Any]]:
        return schema_id, avro_record(framed, self._schemas[schema_id][0], skip=5)

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        assert isinstance(key, int)
        return self._schemas[key][1]
