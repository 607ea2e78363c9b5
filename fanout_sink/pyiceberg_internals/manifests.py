"""Manifest writers and the manifest-list reader, as PyIceberg's, with their Avro layouts built once.

PyIceberg resolves a manifest's Avro writer and renders its header schema for every manifest it
writes, and resolves a reader for every manifest list it reads (~1.1 ms of a ~12 ms table commit);
here they are kept per format version and partition type, and per file schema. The files are
PyIceberg's, byte for byte, but for the random sync marker.

What it reaches into:

- ``pyiceberg.manifest.ManifestWriterV1`` and ``ManifestWriterV2``: subclassed by ``_ManifestWriterV1``
  and ``_ManifestWriterV2`` (and so :class:`DeleteManifestWriter`, overriding ``content`` and the
  private ``_meta``), overriding ``new_writer`` and reading ``_spec``, ``_schema``, ``_output_file``
  and ``_meta``.
- ``pyiceberg.avro.file.AvroFile``: subclassed by ``_ManifestListFile``, overriding ``__enter__`` and
  ``_read_header`` and setting ``decoder``, ``header``, ``schema`` and ``reader``.
- ``pyiceberg.avro.file.AvroOutputFile``: subclassed by ``_PreparedAvroOutputFile``, setting its
  attributes without its ``__init__`` and overriding ``_write_header`` (with the private
  ``_SCHEMA_KEY``, ``MAGIC``, ``META_SCHEMA`` and ``AvroFileHeader``).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO, AvroCompressionCodec
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import (
    _SCHEMA_KEY,
    MAGIC,
    META_SCHEMA,
    SYNC_SIZE,
    AvroFile,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, construct_writer, resolve_reader, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
    PartitionFieldSummary,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
    write_manifest,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.typedef import TableVersion
from pyiceberg.types import StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion


@dataclass(frozen=True)
class _AvroLayout:
    """What writing an Avro file of one schema takes besides its records: the encoder tree from the
    in-memory records to the file's schema, and that schema as the header's JSON."""

    file_schema: Schema
    writer: Writer
    header_schema: str


@functools.lru_cache(maxsize=256)
def _manifest_entry_layout(format_version: TableVersion, partition_type: StructType) -> _AvroLayout:
    """A manifest's layout, which depends on its format version and partition type only. PyIceberg
    builds it for every manifest it writes: the two entry schemas, the writer resolved between them
    and the header's Avro schema, ~0.7 ms of CPU per table commit (of ~14)."""

    def entry(version: TableVersion) -> Schema:
        data_file = data_file_with_partition(partition_type=partition_type, format_version=version)
        return manifest_entry_schema_with_data_file(format_version=version, data_file=data_file)

    file_schema = entry(format_version)
    return _AvroLayout(
        file_schema=file_schema,
        writer=resolve_writer(record_schema=entry(DEFAULT_READ_VERSION), file_schema=file_schema),
        header_schema=json.dumps(
            AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_entry")
        ),
    )


@functools.cache
def _header_writer() -> Writer:
    return construct_writer(file_schema=META_SCHEMA)


class _PreparedAvroOutputFile(AvroOutputFile[ManifestEntry]):
    """PyIceberg's Avro output file with its layout built once (:class:`_AvroLayout`): the same
    header and blocks, byte for byte, but for the random sync marker."""

    def __init__(
        self, output_file: OutputFile, layout: _AvroLayout, schema_name: str, metadata: dict[str, str]
    ) -> None:
        # Not the base's __init__: it would resolve the writer again.
        self.output_file = output_file
        self.file_schema = layout.file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer = layout.writer
        self.metadata = metadata
        self._header_schema = layout.header_schema

    def _write_header(self) -> None:
        codec = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        meta = {
            **self.metadata,
            _SCHEMA_KEY: self._header_schema,
            AVRO_CODEC_KEY: CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec),
        }
        _header_writer().write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))


class _PreparedManifestWriter(ManifestWriter):
    """A manifest writer whose Avro layout is built once per format version and partition type."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        layout = _manifest_entry_layout(self.version, self._spec.partition_type(self._schema))
        return _PreparedAvroOutputFile(self._output_file, layout, "manifest_entry", self._meta)


class _ManifestWriterV1(_PreparedManifestWriter, ManifestWriterV1):
    pass


class _ManifestWriterV2(_PreparedManifestWriter, ManifestWriterV2):
    pass


_MANIFEST_WRITERS: dict[int, type[ManifestWriter]] = {1: _ManifestWriterV1, 2: _ManifestWriterV2}


def manifest_writer(
    format_version: TableVersion,
    spec: PartitionSpec,
    schema: Schema,
    output_file: OutputFile,
    snapshot_id: int,
    compression: AvroCompressionCodec,
) -> ManifestWriter:
    """PyIceberg's ``write_manifest``, with the manifest's Avro layout built once per format version
    and partition type (:func:`_manifest_entry_layout`); a v3 table's is PyIceberg's own."""
    writer = _MANIFEST_WRITERS.get(format_version)
    if writer is None:
        return write_manifest(format_version, spec, schema, output_file, snapshot_id, compression)
    return writer(spec, schema, output_file, snapshot_id, compression)


@functools.cache
def _header_reader() -> Reader:
    return construct_reader(META_SCHEMA, {-1: AvroFileHeader})


@functools.lru_cache(maxsize=64)
def _manifest_list_reader(file_schema: str) -> tuple[Schema, Reader]:
    """The reader of a manifest list whose header carries the Avro schema ``file_schema``: PyIceberg
    parses that schema and resolves the reader for every list it reads (~0.4 ms a table commit)."""
    schema = AvroSchemaConversion().avro_to_iceberg(json.loads(file_schema))
    reader = resolve_reader(
        schema,
        MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
        {-1: ManifestFile, 508: PartitionFieldSummary},
        {517: ManifestContent},
    )
    return schema, reader


class _ManifestListFile(AvroFile[ManifestFile]):
    """PyIceberg's Avro reader of a manifest list, with its reader resolved once per file schema."""

    def __enter__(self) -> _ManifestListFile:
        with self.input_file.open() as stream:
            self.decoder = new_decoder(stream.read())
        self.header = self._read_header()
        self.schema, self.reader = _manifest_list_reader(self.header.meta[_SCHEMA_KEY])
        return self

    def _read_header(self) -> AvroFileHeader:
        header: AvroFileHeader = _header_reader().read(self.decoder)
        return header


def read_manifest_list(input_file: InputFile) -> list[ManifestFile]:
    """PyIceberg's ``read_manifest_list``, the reader resolved once per file schema."""
    with _ManifestListFile(input_file, MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION]) as manifests:
        return list(manifests)


class DeleteManifestWriter(_ManifestWriterV2):
    """PyIceberg 0.12's v2 manifest writer says every manifest holds data; this one holds deletes."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}
