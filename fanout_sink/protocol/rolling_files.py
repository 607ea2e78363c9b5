"""An append table's rows streamed across the chunks of one slice into open Parquet files, rolled by size.

A worker processes a slice in chunks (``spark.max-records-per-batch``) so that its memory holds one
chunk's raw records, decoded values and intermediates, not the whole slice's. Writing each chunk's
rows as its own files would make a table's file count grow with the slice's chunks; holding the rows
until a file's worth is gathered would make a worker's memory grow with the slice (up to the 512 MB
default target per table). So each append table keeps one open Parquet writer per partition: every
chunk's rows go out as row groups, and a file is closed and a new one opened when it holds the
table's ``write.target-file-size-bytes`` (in Arrow bytes, the measure PyIceberg bin-packs by).

A table's rows are held until they make a row group of :data:`ROW_GROUP_BYTES`, within one budget for
the whole slice write (:data:`BUFFER_BYTES`; over it, the largest are written first). A sink routing to
500 tables gives each ~100 rows of a 50,000-record chunk: written chunk by chunk, every file was made of
~100-row row groups (readers pay per row group) and every chunk paid each table's conversion to the file
schema and a Parquet write call, fixed costs that dominated fan-out (issue 34). What a worker holds beyond
a chunk is that budget and the writers' footers, whatever the slice's size.

Files are written the way PyIceberg's ``_dataframe_to_data_files`` writes them (same conversion to the
file schema with field ids, same Parquet writer options from the table's write properties, same
statistics from the Parquet footer, same partition values and locations; its private helpers through
:mod:`fanout_sink.pyiceberg_internals.arrow_writes`), so a ``DataFile`` from here equals one from
:func:`.datafiles.write_data_files` for the same rows. What PyIceberg derives from the schema for each
file and batch is derived once per table layout (``file_layouts.py``).

Change tables never come here: their rows of one chunk are the keys' last changes in that chunk, and
a later chunk may change a key again, so each chunk is written and announced on its own (the
coordinator resolves a slice's change sets in control-topic order: the last one wins).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.io import OutputFile
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionKey
from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, Table, TableProperties
from pyiceberg.typedef import Record
from pyiceberg.utils.config import Config
from pyiceberg.utils.properties import property_as_int

from fanout_sink import durable_io
from fanout_sink.protocol import datafiles
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.file_layouts import PARQUET, ParquetFile, layout_for
from fanout_sink.pyiceberg_internals import arrow_writes

ROW_GROUP_BYTES = 16 * 1024 * 1024
"""A table's held rows are written once they reach this many Arrow bytes (or its target file size)."""
BUFFER_BYTES = 64 * 1024 * 1024
"""The rows one slice write holds over all its tables: beyond it the largest tables' rows are written."""


def target_file_bytes(table: Table) -> int:
    """The table's ``write.target-file-size-bytes`` (PyIceberg's default when unset)."""
    target = property_as_int(
        table.metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    return max(1, target or TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT)


@dataclass
class WrittenTable:
    """One append table's files of a slice written for one table uuid: what its ``DataWritten``
    events announce, under that uuid. A table dropped and recreated between chunks numbers its
    fields anew, so files of the old one must not go out as the new one's (field id 2 read as
    another column): the coordinator rewrites them by column name or refuses them."""

    table: Table
    """The table the files were written with, as last written (a newer schema after evolution)."""
    records: list[ev.DataFileRecord] = field(default_factory=list)
    rows: int = 0


@dataclass
class _OpenFile:
    """One Parquet file being written: rows go in as row groups until it is full."""

    writer: ParquetFile
    output: OutputFile
    path: str
    partition_key: PartitionKey | None
    rows: int = 0


class _FileNames:
    """PyIceberg's data file naming (``00000-<task>-<write uuid>``) with a fresh uuid per slice write and
    a counter across all its tables and schemas: two attempts of one slice never share a name, and the
    writer opened after a schema change never reuses (and overwrites) a name of the former one."""

    def __init__(self) -> None:
        self._uuid = uuid.uuid4()
        self._count = itertools.count()

    def next(self) -> str:
        return f"00000-{next(self._count)}-{self._uuid}.{PARQUET.file_extension()}"


class _TableWriter:
    """The held rows and open files (one per partition) of one table in one schema."""

    def __init__(
        self, table: Table, schema: pa.Schema, names: _FileNames, downcast: bool, unsynced: list[str]
    ) -> None:
        self.table = table
        self.schema = schema
        self._names = names
        self._unsynced = unsynced
        self._layout = layout_for(table, schema, downcast)
        self._target = target_file_bytes(table)
        self._held: list[pa.Table] = []
        self.held_bytes = 0
        self._open: dict[tuple[object, ...], _OpenFile] = {}

    def write(self, rows: pa.Table) -> list[DataFile]:
        """Hold ``rows``; once the held rows make a row group, write them (:meth:`flush`)."""
        self._held.append(rows)
        self.held_bytes += rows.nbytes
        if self.held_bytes < min(self._target, ROW_GROUP_BYTES):
            return []
        return self.flush()

    def flush(self) -> list[DataFile]:
        """Write the held rows into the open files of their partitions; the files this filled and closed."""
        if not self._held:
            return []
        # One chunk: the conversion to the file schema runs once per record batch.
        rows = pa.concat_tables(self._held).combine_chunks()
        self._held, self.held_bytes = [], 0
        spec = self.table.metadata.spec()
        if spec.is_unpartitioned():
            return self._write_partition(None, rows)
        closed = []
        for partition_key, part in arrow_writes.partitions(spec, self.table.metadata.schema(), rows):
            closed += self._write_partition(partition_key, part)
        return closed

    def close(self) -> list[DataFile]:
        """Write the held rows and close every open file; their data files."""
        closed = self.flush()
        while self._open:
            closed.append(self._close(self._open.pop(next(iter(self._open)))))
        return closed

    def discard(self) -> None:
        """Drop the held rows and close the open files' streams after a failure (the files stay
        orphans of no snapshot)."""
        self._held, self.held_bytes = [], 0
        for open_file in self._open.values():
            with contextlib.suppress(Exception):  # the failure being handled is the one to report
                open_file.writer.close()
        self._open.clear()

    def _write_partition(self, partition_key: PartitionKey | None, rows: pa.Table) -> list[DataFile]:
        converted = self._layout.to_file(rows)
        # Rows per file from the Arrow bytes per row, as PyIceberg's bin packing estimates them.
        per_file = max(1, self._target // max(1, converted.nbytes // max(1, converted.num_rows)))
        key = tuple(v.value for v in partition_key.field_values) if partition_key else ()
        closed = []
        offset = 0
        while offset < converted.num_rows:
            open_file = self._open.get(key) or self._new_file(key, partition_key)
            take = min(converted.num_rows - offset, max(1, per_file - open_file.rows))
            open_file.writer.write(converted.slice(offset, take))
            open_file.rows += take
            offset += take
            if open_file.rows >= per_file:
                closed.append(self._close(self._open.pop(key)))
        return closed

    def _new_file(self, key: tuple[object, ...], partition_key: PartitionKey | None) -> _OpenFile:
        path = self.table.location_provider().new_data_location(
            self._names.next(), partition_key=partition_key
        )
        output = self.table.io.new_output(path)
        open_file = _OpenFile(
            writer=ParquetFile(output, self._layout),
            output=output,
            path=path,
            partition_key=partition_key,
        )
        self._open[key] = open_file
        return open_file

    def _close(self, open_file: _OpenFile) -> DataFile:
        with durable_io.syncs_deferred(self._unsynced):  # fsynced with the others at finish
            statistics = open_file.writer.close()
        metadata = self.table.metadata
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=open_file.path,
            file_format=FileFormat.PARQUET,
            partition=open_file.partition_key.partition if open_file.partition_key else Record(),
            file_size_in_bytes=len(open_file.output),
            sort_order_id=None,
            spec_id=metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )
        # PyIceberg 0.12 drops spec_id in DataFile.from_args (see datafiles.write_data_files).
        data_file.spec_id = metadata.default_spec_id
        return data_file


class RollingFiles:
    """Per append table, the slice's open files; one instance per slice write."""

    def __init__(self, buffer_bytes: int = BUFFER_BYTES) -> None:
        self.buffer_bytes = buffer_bytes
        self._names = _FileNames()
        self._writers: dict[str, _TableWriter] = {}
        self._written: dict[str, list[WrittenTable]] = {}
        # Read once per slice: PyIceberg's Config() reads its file and the environment (0.3 ms a table).
        self._downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        self._held = 0
        """The sum of the writers' ``held_bytes``, kept as they change: summed per ``add``, a chunk over
        5,000 tables cost 1 s of bookkeeping."""
        self._unsynced: list[str] = []
        """The files closed so far and their directories, fsynced together at :meth:`finish` (on a
        local warehouse; :mod:`fanout_sink.durable_io`): one at a time, each file's two fsyncs were
        ~2 ms of a slice's wall time at 5,000 tables."""

    def add(self, identifier: str, table: Table, rows: pa.Table) -> None:
        """Write one chunk's rows of a table into its open files, closing each that gets full."""
        if rows.num_rows == 0:
            return
        writer = self._writers.get(identifier)
        if writer is not None and (
            writer.schema != rows.schema or writer.table.metadata.table_uuid != table.metadata.table_uuid
        ):
            # The table evolved or was recreated between chunks: the files so far hold its former
            # schema and are closed as they are (Iceberg reads old files by field id; the coordinator
            # rewrites a former table's files by name), so that one file holds one schema.
            self._held -= writer.held_bytes
            self._record(identifier, writer.table, writer.close())
            writer = None
        if writer is None:
            writer = self._writers[identifier] = _TableWriter(
                table, rows.schema, self._names, self._downcast, self._unsynced
            )
        before = writer.held_bytes
        files = writer.write(rows)
        self._held += writer.held_bytes - before
        self._record(identifier, writer.table, files).rows += rows.num_rows
        self._within_budget()

    @property
    def held_bytes(self) -> int:
        """The Arrow bytes of the rows held for row groups, over every table."""
        return self._held

    def _within_budget(self) -> None:
        """Over the budget, the largest held rows are written until half of it is held: a table's
        rows still leave in few, large row groups, and memory stays bounded by the budget."""
        if self._held <= self.buffer_bytes:
            return
        for identifier, writer in sorted(self._writers.items(), key=lambda item: -item[1].held_bytes):
            if self._held <= self.buffer_bytes // 2:
                break
            self._held -= writer.held_bytes
            self._record(identifier, writer.table, writer.flush())

    def finish(self) -> dict[str, list[WrittenTable]]:
        """Close every open file and fsync every file closed (before any event can name them); per
        table, its files of the slice by the table uuid they were written for (one, unless the table
        was recreated meanwhile), in the order written."""
        for identifier in list(self._writers):
            writer = self._writers[identifier]
            self._record(identifier, writer.table, writer.close())
            del self._writers[identifier]
        self._held = 0
        durable_io.fsync_all(self._unsynced)
        self._unsynced.clear()
        return self._written

    def discard(self) -> None:
        """Close every open file after a failed slice write: their names are in no event, so they
        stay orphans (as after a crash) for orphan cleanup."""
        for writer in self._writers.values():
            writer.discard()
        self._writers.clear()
        self._held = 0

    def _record(self, identifier: str, table: Table, files: list[DataFile]) -> WrittenTable:
        """``files`` of ``table`` (the one that wrote them) added to that table uuid's files."""
        tables = self._written.setdefault(identifier, [])
        if not tables or tables[-1].table.metadata.table_uuid != table.metadata.table_uuid:
            tables.append(WrittenTable(table))
        written = tables[-1]
        written.table = table
        written.records += [datafiles.to_record(f, table) for f in files]
        return written
