"""Everything of the sink that extends PyIceberg or reaches into its internals, in one place.

PyIceberg 0.12.0 is pinned. What the sink needs beyond PyIceberg's public API (a fast append that
keeps each file's partition spec, position deletes in the same snapshot, a commit without PyIceberg's
rebasing retry, Parquet files written exactly as PyIceberg's append writes them) is built on private
classes, private functions and private attributes, which may change in any release. A PyIceberg
upgrade therefore breaks the sink here and nowhere else: ``tests/test_architecture.py`` fails when
another module imports a private PyIceberg name, uses a private attribute of one, or subclasses a
PyIceberg class. What this module reaches into:

- ``pyiceberg.table.update.snapshot._FastAppendFiles``: subclassed by :class:`SpecPreservingAppend`
  (and so :class:`RowDelta`), overriding ``_manifests``, ``_summary`` and ``_refresh_for_retry`` and
  reading ``_added_data_files``, ``_snapshot_id``, ``_parent_snapshot_id``, ``_operation``,
  ``_compression``, ``_process_manifests``, ``_existing_manifests`` and ``_transaction._table``.
- ``pyiceberg.manifest.ManifestWriterV1`` and ``ManifestWriterV2``: subclassed by ``_ManifestWriterV1``
  and ``_ManifestWriterV2`` (and so :class:`_DeleteManifestWriter`, overriding ``content`` and the
  private ``_meta``), overriding ``new_writer`` and reading ``_spec``, ``_schema``, ``_output_file``
  and ``_meta``; ``SpecPreservingAppend`` overrides ``new_manifest_writer`` to make them.
- ``pyiceberg.avro.file.AvroFile``: subclassed by ``_ManifestListFile``, overriding ``__enter__`` and
  ``_read_header`` and setting ``decoder``, ``header``, ``schema`` and ``reader``; ``SpecPreservingAppend``
  overrides ``_existing_manifests`` to read the parent's manifest list with it.
- ``pyiceberg.avro.file.AvroOutputFile``: subclassed by ``_PreparedAvroOutputFile``, setting its
  attributes without its ``__init__`` and overriding ``_write_header`` (with the private
  ``_SCHEMA_KEY``, ``MAGIC``, ``META_SCHEMA`` and ``AvroFileHeader``).
- ``pyiceberg.table.Transaction``: subclassed by :class:`_StagedTransaction`, overriding
  ``table_metadata`` and reading ``_table`` and ``_updates``.
- ``pyiceberg.table.update``'s ``_apply_table_update``, ``_TableMetadataUpdateContext`` and
  ``_update_table_metadata_log``: :func:`apply_updates`, ``update_table_metadata`` without its deep copy.
- ``pyiceberg.catalog.sql.SqlCatalog``: subclassed by ``_LoadedBaseSqlCatalog`` (built on first use,
  so that SQLAlchemy is imported only by a SQL-catalog sink), overriding ``load_table`` and the
  private ``_update_and_stage_table`` (reading ``_parse_metadata_version`` and ``_load_file_io``),
  and sharing the catalog's attributes without running its ``__init__``.
- ``pyiceberg.catalog.sql``'s ``IcebergTables`` (the catalog's table rows) and ``SqlCatalog``'s private
  ``_iceberg_type_filter``: :func:`current_table_uuids` reads many tables' metadata pointers in one query.
- ``pyiceberg.catalog.hive.HiveCatalog``: subclassed by ``ThreadSafeHiveCatalog`` (built on first use,
  so that ``thrift`` is imported only by a Hive sink), replacing the private ``_client`` attribute
  by one thrift client per thread and calling the private ``_create_hive_client``.
- ``pyiceberg.io.pyarrow.PyArrowFileIO`` and ``PyArrowFile``: subclassed by :class:`DurableFileIO`
  (the FileIO that ``py-io-impl`` selects, so its class path is a catalog property) and
  :class:`_DurableFile`, overriding ``new_output`` and ``create``.
- ``pyiceberg.io.pyarrow``'s ``_check_pyarrow_schema_compatible``, ``_dataframe_to_data_files``,
  ``_determine_partitions``, ``_to_requested_schema`` and ``_get_parquet_writer_kwargs``, and
  ``Catalog._convert_schema_if_needed``: behind the public wrappers below.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
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
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO, InputFile, OutputFile, OutputStream
from pyiceberg.io.fileformat import FileFormatModel
from pyiceberg.io.pyarrow import (
    BUFFER_SIZE,
    ONE_MEGABYTE,
    PyArrowFile,
    PyArrowFileIO,
    _check_pyarrow_schema_compatible,
    _dataframe_to_data_files,
    _determine_partitions,
    _get_parquet_writer_kwargs,
    _to_requested_schema,
)
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
    PartitionFieldSummary,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
    write_manifest,
)
from pyiceberg.partitioning import PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import StagedTable, Table, TableProperties, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import (
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Identifier, TableVersion
from pyiceberg.types import StructType
from pyiceberg.utils.datetime import datetime_to_millis
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from fanout_sink.durable_io import SyncingStream


def check_schema_compatible(metadata: TableMetadata, provided: pa.Schema) -> None:
    """Raise ``ValueError`` when Arrow rows of schema ``provided`` cannot be written into the table's
    current schema: the check PyIceberg's own append makes before it writes a file."""
    _check_pyarrow_schema_compatible(
        metadata.schema(), provided_schema=provided, format_version=metadata.format_version
    )


def dataframe_to_data_files(
    metadata: TableMetadata, rows: pa.Table, io: FileIO, write_uuid: uuid.UUID
) -> list[DataFile]:
    """``rows`` written as Parquet data files the way PyIceberg's append writes them (bin-packed to
    the target file size, split by partition, named ``00000-<task>-<write_uuid>``)."""
    return list(_dataframe_to_data_files(table_metadata=metadata, df=rows, io=io, write_uuid=write_uuid))


def partitions(
    spec: PartitionSpec, schema: Schema, rows: pa.Table
) -> Iterator[tuple[PartitionKey, pa.Table]]:
    """``rows`` split by the partition ``spec`` (of ``schema``): each partition's key and rows, as
    PyIceberg's append splits them."""
    for part in _determine_partitions(spec=spec, schema=schema, arrow_table=rows):
        yield part.partition_key, part.arrow_table_partition


def to_file_schema(
    file_schema: Schema,
    rows_schema: Schema,
    batch: pa.RecordBatch,
    downcast_ns_timestamp_to_us: bool,
    format_model: FileFormatModel,
) -> pa.RecordBatch:
    """``batch`` (of Iceberg schema ``rows_schema``) converted to ``file_schema`` with field ids, as
    PyIceberg converts rows before it writes them to a file."""
    return _to_requested_schema(
        requested_schema=file_schema,
        file_schema=rows_schema,
        batch=batch,
        downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us,
        include_field_ids=True,
        format_model=format_model,
    )


def parquet_writer_kwargs(properties: dict[str, str]) -> dict[str, Any]:
    """The ``pyarrow.parquet.ParquetWriter`` options PyIceberg derives from a table's write properties
    (compression, its level, page and dictionary sizes), as its own Parquet writer passes them."""
    return _get_parquet_writer_kwargs(properties)


def schema_from_arrow(schema: pa.Schema) -> Schema:
    """An Iceberg schema (field ids not yet assigned) for an Arrow schema, as ``Catalog.create_table``
    derives it from one."""
    return Catalog._convert_schema_if_needed(schema)


def by_spec(files: Iterable[DataFile]) -> dict[int, list[DataFile]]:
    """``files`` grouped by the partition spec they were written with, in spec id order."""
    grouped: dict[int, list[DataFile]] = defaultdict(list)
    for added in files:
        grouped[added.spec_id].append(added)
    return dict(sorted(grouped.items()))


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


class SpecPreservingAppend(_FastAppendFiles):
    """An Iceberg fast append that keeps every data file under the partition spec it was written with.

    Workers write files under the table's default spec at write time; the coordinator appends them
    later, possibly after someone changed the partition spec. PyIceberg 0.12's fast append writes all
    added files into one manifest of the table's *current* default spec (and summarises their
    partitions with it), which fails on files of an older spec, every round, for good. Iceberg itself
    allows files of any spec the table still knows: Java's ``FastAppend`` writes one manifest per
    spec. This does the same: ``_FastAppendFiles`` with one added manifest per partition spec id of
    the added files, so the files keep their own partition values and stay prunable under their spec.
    """

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(
            operation=Operation.APPEND,
            transaction=transaction,
            io=io,
            snapshot_properties=snapshot_properties,
        )

    def _by_spec(self) -> dict[int, list[DataFile]]:
        return by_spec(self._added_data_files)

    def _existing_manifests(self) -> list[ManifestFile]:
        """The parent snapshot's manifests that still hold live files, as in PyIceberg's fast append,
        read with :func:`read_manifest_list`."""
        if self._parent_snapshot_id is None:
            return []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        if parent is None:
            raise ValueError(f"Snapshot could not be found: {self._parent_snapshot_id}")
        return [
            manifest
            for manifest in read_manifest_list(self._io.new_input(parent.manifest_list))
            if manifest.has_added_files()
            or manifest.has_existing_files()
            or manifest.added_snapshot_id == self._snapshot_id
        ]

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return manifest_writer(
            self._transaction.table_metadata.format_version,
            spec,
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )

    def _manifests(self) -> list[ManifestFile]:
        added = [
            self._added_manifest(self.new_manifest_writer(self.spec(spec_id)), files)
            for spec_id, files in self._by_spec().items()
        ]
        return self._process_manifests(added + self._existing_manifests())

    def _added_manifest(self, writer: ManifestWriter, files: list[DataFile]) -> ManifestFile:
        """``files`` as ADDED entries of this snapshot (sequence numbers inherited at commit)."""
        with writer:
            for data_file in files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
        return writer.to_manifest_file()

    def _collect(self, collector: SnapshotSummaryCollector, schema: Schema) -> None:
        """Count every added file into the summary, each under its own spec."""
        self._count(collector, schema, self._by_spec())

    def _count(
        self, collector: SnapshotSummaryCollector, schema: Schema, grouped: dict[int, list[DataFile]]
    ) -> None:
        for spec_id, files in grouped.items():
            for added in files:
                collector.add_file(data_file=added, partition_spec=self.spec(spec_id), schema=schema)

    def _summary(self, snapshot_properties: dict[str, str] | None = None) -> Summary:
        metadata = self._transaction.table_metadata
        limit = int(
            metadata.properties.get(
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
            )
        )
        collector = SnapshotSummaryCollector(partition_summary_limit=limit)
        self._collect(collector, metadata.schema())
        parent = (
            metadata.snapshot_by_id(self._parent_snapshot_id)
            if self._parent_snapshot_id is not None
            else None
        )
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **(snapshot_properties or {})),
            previous_summary=parent.summary if parent is not None else None,
        )


class _DeleteManifestWriter(_ManifestWriterV2):
    """PyIceberg 0.12's v2 manifest writer says every manifest holds data; this one holds deletes."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class RowDelta(SpecPreservingAppend):
    """One snapshot that adds data files (each under its own spec) and position-delete files.

    Its commit asserts that the table's branch still points at the snapshot the transaction started
    from, so deletes resolved against that snapshot can never land on another one."""

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(transaction, io, snapshot_properties)
        self._added_delete_files: list[DataFile] = []

    def __enter__(self) -> RowDelta:
        return self

    def _refresh_for_retry(self) -> None:
        """Refuse PyIceberg's retry: it would rebase this snapshot onto a newer head, but the deletes
        (and which rows count as new) were resolved against the old one. The caller resolves again."""
        raise CommitFailedException(
            f"table {'.'.join(self._transaction._table.name())} changed since its changes were resolved "
            f"against snapshot {self._parent_snapshot_id}; resolve them again on the reloaded table"
        )

    def add_delete_file(self, delete_file: DataFile) -> RowDelta:
        if delete_file.content != DataFileContent.POSITION_DELETES:
            raise ValueError(f"{delete_file.file_path} is not a position-delete file")
        self._added_delete_files.append(delete_file)
        self._operation = Operation.OVERWRITE
        return self

    def _deletes_by_spec(self) -> dict[int, list[DataFile]]:
        return by_spec(self._added_delete_files)

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        for spec_id, files in self._deletes_by_spec().items():
            writer = _DeleteManifestWriter(
                spec=self.spec(spec_id),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            )
            manifests.append(self._added_manifest(writer, files))
        return manifests

    def _collect(self, collector: SnapshotSummaryCollector, schema: Schema) -> None:
        super()._collect(collector, schema)
        self._count(collector, schema, self._deletes_by_spec())


def apply_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """``update_table_metadata(base, updates, metadata_location=...)`` without its final deep copy.

    PyIceberg deep-copies the whole resulting metadata (every snapshot, schema and spec) on each
    application, defensively; it was ~a fifth of a table commit's CPU, growing with the table's
    snapshots (docs/benchmarks/wide-sinks.md). Its models are frozen and every update is applied
    copy-on-write (``model_copy(update=...)``, new lists and dicts), so the result shares only what
    nobody changes with ``base``.
    """
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            now_ms = datetime_to_millis(datetime.now().astimezone())
            metadata = metadata.model_copy(update={"last_updated_ms": now_ms})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


class _StagedTransaction(Transaction):
    """A transaction that applies its staged updates to the table metadata once per change of them.

    PyIceberg's ``Transaction.table_metadata`` re-applies every staged update, deep-copying the
    whole metadata, on each access; one append reads it ~19 times, which was ~40 % of a table
    commit's CPU and grows with the table's snapshots (docs/benchmarks/wide-sinks.md). The result
    is a pure function of the base metadata and the staged updates (both immutable and replaced,
    never changed in place), so it is kept until either is replaced.
    """

    _applied: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        applied = self._applied
        if applied is None or applied[0] is not base or applied[1] is not updates:
            applied = (base, updates, apply_updates(base, updates))
            self._applied = applied
        return applied[2]


@functools.cache
def _loaded_base_sql_catalog() -> type[Catalog]:
    """Made on first use, like the Hive one: PyIceberg's SQL catalog imports SQLAlchemy (150 modules,
    20 MB), which the processes of a REST or Hive sink never need."""
    from pyiceberg.catalog.sql import SqlCatalog

    class _LoadedBaseSqlCatalog(SqlCatalog):
        """The SQL catalog committing one table against the metadata its caller loaded it with.

        ``SqlCatalog.commit_table`` loads the table again (a query, the metadata JSON read and parsed)
        to check the requirements against and apply the updates to: a second load per table commit
        after the caller's own, ~a fifth of the commit's CPU. The caller's load is as good: the commit's
        ``UPDATE`` still requires the table's row to point at the metadata location that was loaded,
        so a commit by anyone in between fails it with ``CommitFailedException`` exactly as before,
        and requirements that hold on that metadata hold on the metadata the ``UPDATE`` requires.

        It never runs the catalog's ``__init__``: every attribute (name, properties, engine) is read
        from ``catalog``; only ``base``'s own identifier is answered from ``base``.
        """

        def __init__(self, catalog: SqlCatalog, base: Table) -> None:
            self._catalog = catalog
            self._base = base

        def __getattr__(self, name: str) -> Any:
            return getattr(self._catalog, name)

        def load_table(self, identifier: str | Identifier) -> Table:
            if self.identifier_to_tuple(identifier) != self._base.name():
                return self._catalog.load_table(identifier)
            return self._base

        def _update_and_stage_table(
            self,
            current_table: Table | None,
            table_identifier: Identifier,
            requirements: tuple[TableRequirement, ...],
            updates: tuple[TableUpdate, ...],
        ) -> StagedTable:
            """PyIceberg's staging of an existing table's commit, with :func:`apply_updates`."""
            if current_table is None:
                return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
            for requirement in requirements:
                requirement.validate(current_table.metadata)
            metadata = apply_updates(current_table.metadata, updates, current_table.metadata_location)
            version = self._parse_metadata_version(current_table.metadata_location) + 1
            provider = load_location_provider(metadata.location, metadata.properties)
            location = provider.new_table_metadata_file_location(version)
            return StagedTable(
                identifier=table_identifier,
                metadata=metadata,
                metadata_location=location,
                io=self._load_file_io(properties=metadata.properties, location=location),
                catalog=self,
            )

    return _LoadedBaseSqlCatalog


_NAMES_PER_QUERY = 500
"""Table names in one ``IN`` list of :func:`current_table_uuids`' query (SQLite allows 32,766 variables)."""
_HEAD_BYTES = 4096
_TABLE_UUID = re.compile(rb'"table-uuid"\s*:\s*"([0-9a-fA-F-]{36})"')


def current_table_uuids(tables: dict[str, Table]) -> dict[str, str | None]:
    """The uuid each table's SQL catalog holds under its name now (None: no such table), for the
    tables whose catalog is a SQL catalog; the others are left out, for the caller to load.

    A worker checks before every transaction that its cached tables were not dropped and recreated.
    Loading each table for that read and validated its whole metadata JSON, which grows with the
    snapshots kept (0.8 ms a table with 11 snapshots, against 0.04 ms here). Here one query reads the pointers
    of up to :data:`_NAMES_PER_QUERY` tables; a pointer that has not moved since the table was loaded
    is the same table; a moved one (every table commit moves it) is asked for ``table-uuid`` only,
    from the head of the new metadata file, where Iceberg's writers put it, else from all of it.
    """
    sql = sys.modules.get("pyiceberg.catalog.sql")  # not imported: no SQL catalog in this process
    if sql is None:
        return {}
    by_catalog: dict[int, list[tuple[str, Table]]] = defaultdict(list)
    for identifier, table in tables.items():
        if isinstance(table.catalog, sql.SqlCatalog):
            by_catalog[id(table.catalog)].append((identifier, table))
    found: dict[str, str | None] = {}
    for group in by_catalog.values():
        found.update(_sql_table_uuids(group[0][1].catalog, group))
    return found


def _sql_table_uuids(catalog: Any, tables: list[tuple[str, Table]]) -> dict[str, str | None]:
    pointers = _sql_pointers(catalog, {_catalog_key(table.name()) for _, table in tables})
    uuids: dict[str, str | None] = {}
    for identifier, table in tables:
        location = pointers.get(_catalog_key(table.name()))
        if not location:
            uuids[identifier] = None
        elif location == table.metadata_location:
            uuids[identifier] = str(table.metadata.table_uuid)
        else:
            uuids[identifier] = _metadata_table_uuid(table.io, location)
    return uuids


def _catalog_key(identifier: str | Identifier) -> tuple[str, str]:
    """(namespace, name) as the SQL catalog's rows hold them."""
    return Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(
        identifier
    )


def _sql_pointers(catalog: Any, names: set[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """The metadata location of each (namespace, name) the SQL catalog holds, one query per
    :data:`_NAMES_PER_QUERY` table names."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select

    pointers: dict[tuple[str, str], str | None] = {}
    wanted = sorted({name for _, name in names})
    with catalog.engine.connect() as connection:
        for start in range(0, len(wanted), _NAMES_PER_QUERY):
            query = select(
                IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location
            ).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_name.in_(wanted[start : start + _NAMES_PER_QUERY]),
            )
            if (type_filter := catalog._iceberg_type_filter()) is not None:
                query = query.where(type_filter)
            for namespace, name, location in connection.execute(query):
                pointers[(namespace, name)] = location
    return pointers


def sql_metadata_locations(catalog: Catalog, identifiers: Iterable[str]) -> dict[str, str | None] | None:
    """Per identifier, the metadata location its SQL catalog points at now (None: no such table);
    None when ``catalog`` is not a SQL catalog (the caller loads each table from the catalog).

    A round's table commits load every due table. ``SqlCatalog.load_table`` spends half of a load in
    one ORM query per table (~1 ms of ~1.8 ms); here one query reads the pointers of up to
    :data:`_NAMES_PER_QUERY` tables, and :func:`load_table_at` reads each table's metadata from its
    pointer. A pointer that moves meanwhile is no hazard: the commit's ``UPDATE`` requires the row
    to still point where the metadata was read (see :func:`_loaded_base_sql_catalog`).
    """
    sql = sys.modules.get("pyiceberg.catalog.sql")  # not imported: not a SQL catalog
    if sql is None or not isinstance(catalog, sql.SqlCatalog):
        return None
    keys = {identifier: _catalog_key(identifier) for identifier in identifiers}
    pointers = _sql_pointers(catalog, set(keys.values())) if keys else {}
    return {identifier: pointers.get(key) for identifier, key in keys.items()}


def load_table_at(catalog: Catalog, identifier: str, location: str) -> Table:
    """The table as the metadata file at ``location`` holds it, built as ``SqlCatalog.load_table``
    builds it from its row, for a location :func:`sql_metadata_locations` read."""
    io = catalog._load_file_io(location=location)
    metadata = FromInputFile.table_metadata(io.new_input(location))
    return Table(
        identifier=Catalog.identifier_to_tuple(identifier),
        metadata=metadata,
        metadata_location=location,
        io=catalog._load_file_io(metadata.properties, location),
        catalog=catalog,
    )


def _metadata_table_uuid(io: FileIO, location: str) -> str:
    with io.new_input(location).open() as stream:
        text = stream.read(_HEAD_BYTES)
        if (found := _TABLE_UUID.search(text)) is not None:
            return str(uuid.UUID(found.group(1).decode()))
        text += stream.read()
    if location.endswith((".gz.metadata.json", ".metadata.json.gz")):
        text = gzip.decompress(text)
    return str(uuid.UUID(json.loads(text)["table-uuid"]))


def no_retry_transaction(table: Table) -> Transaction:
    """A transaction whose commit is attempted exactly once.

    PyIceberg 0.12 retries a failed commit by rebasing the same append onto the new head, reading
    the retry count from the table properties at commit time. Rebasing without re-checking the
    stored control offsets could append files another coordinator already appended, so the
    transaction runs on a view of the table whose properties say ``commit.retry.num-retries=0``.
    Only updates and requirements are sent to the catalog: the table's real properties are untouched.
    A SQL catalog commits against ``table`` as loaded instead of loading it again
    (``_LoadedBaseSqlCatalog``); other catalogs (a REST catalog's commit loads nothing in the
    client) commit as they do.
    """
    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    catalog = table.catalog
    pinned = Table(
        table.name(),
        metadata=table.metadata.model_copy(update={"properties": properties}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=_commit_catalog(catalog, table),
    )
    return _StagedTransaction(pinned)


def _commit_catalog(catalog: Catalog, table: Table) -> Catalog:
    sql = sys.modules.get("pyiceberg.catalog.sql")  # not imported: the catalog is no SqlCatalog
    if sql is not None and isinstance(catalog, sql.SqlCatalog):
        return _loaded_base_sql_catalog()(catalog, table)  # type: ignore[call-arg]
    return catalog


class _DurableFile(PyArrowFile):
    def __init__(self, location: str, path: str, fs: Any, buffer_size: int) -> None:
        super().__init__(location=location, path=path, fs=fs, buffer_size=buffer_size)
        self.local_path = path

    def create(self, overwrite: bool = False) -> OutputStream:
        new_dirs = []
        directory = os.path.dirname(self.local_path)
        while directory and not os.path.exists(directory):
            new_dirs.append(directory)
            directory = os.path.dirname(directory)
        stream = super().create(overwrite=overwrite)
        return SyncingStream(stream, self.local_path, new_dirs)


class DurableFileIO(PyArrowFileIO):
    """``PyArrowFileIO`` whose local files are fsynced (with their directories) when closed: why, in
    :mod:`fanout_sink.durable_io`."""

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        if scheme != "file":
            return super().new_output(location)
        return _DurableFile(
            location=location,
            path=path,
            fs=self.fs_by_scheme(scheme, netloc),
            buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)),
        )


def __getattr__(name: str) -> Any:
    """``ThreadSafeHiveCatalog`` is made on first use: PyIceberg's Hive module needs ``thrift``, which
    no other catalog's processes should import."""
    if name == "ThreadSafeHiveCatalog":
        return _thread_safe_hive_catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _thread_safe_hive_catalog() -> type[Catalog]:
    from pyiceberg.catalog.hive import HiveCatalog

    class ThreadSafeHiveCatalog(HiveCatalog):
        """PyIceberg's HiveCatalog keeps one thrift connection and opens and closes it around every
        call, so calls from two threads close each other's socket: the coordinator's commit threads
        failed with "Transport not open" (after the metastore lock, before the unlock). One client,
        hence one connection, per thread."""

        def __init__(self, name: str, **properties: str) -> None:
            self._clients = threading.local()
            super().__init__(name, **properties)

        @property  # type: ignore[override]
        def _client(self) -> Any:
            client = getattr(self._clients, "client", None)
            if client is None:
                client = self._clients.client = self._create_hive_client(self.properties)
            return client

        @_client.setter
        def _client(self, client: Any) -> None:
            self._clients.client = client

    return ThreadSafeHiveCatalog
