"""Kafka value bytes -> Arrow, a whole batch at a time, one module per format family.

``source.format`` picks the decoder from :data:`DECODERS`:

* ``json`` (:mod:`~fanout_sink.transform.formats.json`): one JSON object per value, parsed by
  Arrow's JSON reader in as few calls as the values allow, bad values screened out in whole-batch
  kernels.
* ``avro`` (:mod:`~fanout_sink.transform.formats.avro`): schemaless Avro with the writer schema
  from an ``.avsc`` file (``source.schema``).
* ``confluent-avro``, ``confluent-protobuf`` and ``confluent-json-schema``: the Schema Registry's
  wire format, one path for the three (:mod:`~fanout_sink.transform.formats.registry`: header,
  schema lookup per id, references, one table per writer schema) with one reader per format
  (:mod:`~fanout_sink.transform.formats.avro`, :mod:`~fanout_sink.transform.formats.protobuf`,
  :mod:`~fanout_sink.transform.formats.json_schema`).

Every decoder returns a :class:`~fanout_sink.transform.formats.decoded.Decoded`: the records as an
Arrow table, the index of each record's row in the input, and the failures (input index, reason)
that become dead letters. This module is the package's public face: the table and
:func:`build_decoder`.
"""

from __future__ import annotations

from collections.abc import Callable

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import ConfigError, SchemaError
from fanout_sink.transform.formats.decoded import Decoder
from fanout_sink.transform.formats.json import JsonDecoder

# The Avro, registry, Protobuf and JSON Schema modules are imported by the factory that needs them:
# the registry's libraries take a second or more to import, which a sink reading JSON would pay.


def _json(config: SinkConfig) -> Decoder:
    return JsonDecoder()


def _avro(config: SinkConfig) -> Decoder:
    from fanout_sink.avro_schema import load_avro_schema
    from fanout_sink.transform.formats.avro import AvroDecoder

    assert config.source.schema_file is not None, "the config requires source.schema for avro"
    try:
        return AvroDecoder(load_avro_schema(config.resolve(config.source.schema_file)))
    except SchemaError as exc:
        raise ConfigError(config.name, "source.schema", str(exc), 'e.g. "schemas/order.avsc"') from None


def _timeout_s(config: SinkConfig) -> float:
    return config.source.unknown_schema_id_timeout.total_seconds()


def _confluent_avro(config: SinkConfig) -> Decoder:
    from fanout_sink.transform.formats.avro import AvroReader
    from fanout_sink.transform.formats.registry import RegistryDecoder

    return RegistryDecoder(AvroReader, config.source.schema_registry, _timeout_s(config))


def _confluent_protobuf(config: SinkConfig) -> Decoder:
    from fanout_sink.transform.formats.protobuf import ProtobufReader
    from fanout_sink.transform.formats.registry import RegistryDecoder

    return RegistryDecoder(ProtobufReader, config.source.schema_registry, _timeout_s(config))


def _confluent_json_schema(config: SinkConfig) -> Decoder:
    from fanout_sink.transform.formats.json_schema import JsonSchemaReader
    from fanout_sink.transform.formats.registry import RegistryDecoder

    return RegistryDecoder(JsonSchemaReader, config.source.schema_registry, _timeout_s(config))


DECODERS: dict[str, Callable[[SinkConfig], Decoder]] = {
    "json": _json,
    "avro": _avro,
    "confluent-avro": _confluent_avro,
    "confluent-protobuf": _confluent_protobuf,
    "confluent-json-schema": _confluent_json_schema,
}
"""``source.format`` -> the factory of its decoder."""


def build_decoder(config: SinkConfig) -> Decoder:
    """The decoder for ``config.source`` (a :class:`~fanout_sink.config.models.SinkConfig`)."""
    return DECODERS[config.source.format](config)
