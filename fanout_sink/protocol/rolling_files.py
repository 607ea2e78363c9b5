"""An append table's rows gathered across the chunks of one slice and written at the target file size.

A worker processes a slice in chunks (``spark.max-records-per-batch``) so that its memory holds one
chunk's raw records, decoded values and intermediates, not the whole slice's. Writing each chunk's
rows as its own files would make a table's file count grow with the slice's chunks, so the rows of
an append table, already converted to the table's schema (the compact end of the pipeline), wait
here until they reach the table's ``write.target-file-size-bytes`` (in Arrow bytes, the measure
PyIceberg bin-packs by); a full file's worth is written and the rest waits for the next chunk or the
slice's end. So a table's files roll by size, and what a worker holds beyond a chunk is at most one
target file's rows per table.

Change tables never come here: their rows of one chunk are the keys' last changes in that chunk, and
a later chunk may change a key again, so each chunk is written and announced on its own (the
coordinator resolves a slice's change sets in control-topic order: the last one wins).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.table import Table, TableProperties
from pyiceberg.utils.properties import property_as_int

from fanout_sink.protocol import datafiles
from fanout_sink.protocol import events as ev


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
    """One append table's files of a slice: what its ``DataWritten`` events announce."""

    table: Table
    """The table as last handed in (same uuid for every chunk; a newer schema after evolution)."""
    records: list[ev.DataFileRecord] = field(default_factory=list)
    rows: int = 0


@dataclass
class _Pending:
    table: Table
    parts: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0


class RollingFiles:
    """Per append table, the slice's rows not yet written; one instance per slice write."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._written: dict[str, WrittenTable] = {}

    def add(self, identifier: str, table: Table, rows: pa.Table) -> None:
        """Take one chunk's rows of a table; write every full target file's worth of them now."""
        if rows.num_rows == 0:
            return
        pending = self._pending.get(identifier)
        if pending is not None and (
            pending.parts[0].schema != rows.schema
            or pending.table.metadata.table_uuid != table.metadata.table_uuid
        ):
            # The table evolved between chunks: the rows so far are in its former schema, written as
            # they are (Iceberg reads old files by field id), so that one file holds one schema.
            self._write(identifier, pending.table, pa.concat_tables(pending.parts))
            pending = None
        if pending is None:
            pending = self._pending[identifier] = _Pending(table)
        pending.table = table
        pending.parts.append(rows)
        pending.nbytes += rows.nbytes
        target = target_file_bytes(table)
        if pending.nbytes < target:
            return
        gathered = pa.concat_tables(pending.parts)
        per_row = max(1, gathered.nbytes // gathered.num_rows)
        fits = max(1, target // per_row)
        full = gathered.num_rows // fits * fits
        for offset in range(0, full, fits):
            self._write(identifier, table, gathered.slice(offset, fits))
        rest = gathered.slice(full)
        pending.parts, pending.nbytes = ([rest], rest.nbytes) if rest.num_rows else ([], 0)
        if not pending.parts:
            del self._pending[identifier]

    def finish(self) -> dict[str, WrittenTable]:
        """Write what is left of every table; per table, its files of the slice."""
        for identifier, pending in self._pending.items():
            self._write(identifier, pending.table, pa.concat_tables(pending.parts))
        self._pending.clear()
        return self._written

    def _write(self, identifier: str, table: Table, rows: pa.Table) -> None:
        written = self._written.setdefault(identifier, WrittenTable(table))
        written.table = table
        written.records += [datafiles.to_record(f, table) for f in datafiles.write_data_files(table, rows)]
        written.rows += rows.num_rows
