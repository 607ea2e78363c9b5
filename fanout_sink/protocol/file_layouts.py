"""How rows of one Arrow schema become a table's Parquet files, worked out once per process: the
file layout (the conversion to the file schema with field ids, PyIceberg's writer options, row group
limit, statistics plan and column ids, derived once per schema shape and shared by every table of
that shape), and PyIceberg's Parquet file writer using it (:class:`ParquetFile`).

Kept apart from the rolling of files (``rolling_files.py``): what PyIceberg derives from a schema
is one concern, how a slice's rows are held and rolled into files by size another.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import OutputFile, OutputStream
from pyiceberg.io.pyarrow import (
    DataFileStatistics,
    ParquetFormatModel,
    StatisticsCollector,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.properties import property_as_int

from fanout_sink.pyiceberg_internals import arrow_writes

PARQUET = ParquetFormatModel()


@dataclass
class FileLayout:
    """How rows of one Arrow schema become a table schema's files: checked and derived once per
    process for each schema shape, write properties and Arrow schema (:func:`layout_for`), not per slice
    and table (with 500 tables a slice paid ~7 ms each for it), and not per file either: PyIceberg's Parquet
    writer derives its statistics plan and column ids from the schema at every close, and its
    conversion to the file schema walks the schema for every batch (at 2,000 tables of 25 rows a
    slice, ~1.2 ms of each file's ~6 ms)."""

    rows_schema: Schema
    file_schema: Schema
    downcast: bool
    writer_options: dict[str, object]
    row_group_rows: int
    statistics: dict[int, StatisticsCollector]
    column_ids: dict[str, int]
    direct: tuple[pa.Schema, pa.Schema] | None = None
    """(rows' Arrow schema, file Arrow schema) once the conversion of a flat schema turned out to
    change no column's type: then it only names the columns and adds their field ids."""

    def to_file(self, rows: pa.Table) -> pa.Table:
        """``rows`` as the file schema's columns with field ids, as PyIceberg converts them."""
        if self.direct is not None and rows.schema.equals(self.direct[0]):
            return pa.Table.from_arrays(rows.columns, schema=self.direct[1])
        converted = pa.Table.from_batches(
            [
                arrow_writes.to_file_schema(self.file_schema, self.rows_schema, batch, self.downcast, PARQUET)
                for batch in rows.to_batches()
            ]
        )
        if self.direct is None and _only_named(rows.schema, converted.schema):
            self.direct = (rows.schema, converted.schema)
        return converted


def _only_named(rows: pa.Schema, converted: pa.Schema) -> bool:
    """Whether converting ``rows`` kept every column's type and place (no cast, no column added or
    reordered, nothing nested whose children the conversion rebuilds)."""
    if len(rows) != len(converted):
        return False
    for before, after in zip(rows, converted, strict=True):
        if pa.types.is_nested(before.type) or before.type != after.type:
            return False
    return True


LAYOUTS: dict[tuple[object, ...], FileLayout] = {}
"""Per table uuid, schema id, write properties and Arrow schema: the layout its files use. A lookup
here costs no schema walk."""
_MAX_LAYOUTS = 65_536
SHAPES: dict[tuple[object, ...], FileLayout] = {}
"""Per schema shape (the Iceberg schema's fields without its id, format version, write properties,
Arrow schema): one layout shared by every table of that shape. Dynamic routing makes thousands of
tables of one schema; a layout each was derived per table (~1 ms) and held per table, and with a
cap below the tables a worker serves (4,096 at 5,000 tables) the cache emptied itself every batch:
11 % of a worker's wall time in a 5,000-table run (py-spy)."""
_MAX_SHAPES = 4096


WRITE_PREFIX = "write."
"""Iceberg's prefix of the properties a file layout follows (Parquet writer options, metrics modes,
row-group limit)."""


def _write_properties(properties: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The properties a layout depends on, as a key. Not the others: the sink records its state in
    properties at every commit, and keyed on those a table got a new layout after each round (and
    tables of one schema stopped sharing theirs)."""
    return tuple(sorted((k, v) for k, v in properties.items() if k.startswith(WRITE_PREFIX)))


def layout_for(table: Table, schema: pa.Schema, downcast: bool) -> FileLayout:
    """The layout of ``table``'s files for rows of ``schema``: found by table, else by schema shape,
    else derived (and PyIceberg's schema compatibility check run) once."""
    metadata = table.metadata
    properties = _write_properties(metadata.properties)
    key = (
        metadata.table_uuid,
        metadata.current_schema_id,
        metadata.format_version,
        properties,
        schema,
        downcast,
    )
    found = LAYOUTS.get(key)
    if found is not None:
        return found
    table_schema = metadata.schema()
    shape = (
        table_schema.model_dump_json(exclude={"schema_id"}),
        metadata.format_version,
        properties,
        schema,
        downcast,
    )
    found = SHAPES.get(shape)
    if found is None:
        found = _derive_layout(metadata, table_schema, schema, downcast)
        if len(SHAPES) >= _MAX_SHAPES:  # schemas evolving for days: start over
            SHAPES.clear()
        SHAPES[shape] = found
    if len(LAYOUTS) >= _MAX_LAYOUTS:  # tables dropped and recreated for days: start over
        LAYOUTS.clear()
    LAYOUTS[key] = found
    return found


def _derive_layout(
    metadata: TableMetadata, table_schema: Schema, schema: pa.Schema, downcast: bool
) -> FileLayout:
    arrow_writes.check_schema_compatible(metadata, schema)
    rows_schema = pyarrow_to_schema(
        schema,
        name_mapping=table_schema.name_mapping,
        downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version,
    )
    sanitized = sanitize_column_names(table_schema)
    file_schema = sanitized if sanitized != table_schema else table_schema
    return FileLayout(
        rows_schema,
        file_schema,
        downcast,
        writer_options=arrow_writes.parquet_writer_kwargs(metadata.properties),
        row_group_rows=property_as_int(
            metadata.properties,
            TableProperties.PARQUET_ROW_GROUP_LIMIT,
            TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
        )
        or TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
        statistics=compute_statistics_plan(file_schema, metadata.properties),
        column_ids=parquet_path_to_id_mapping(file_schema),
    )


class ParquetFile:
    """PyIceberg's Parquet file writer (same writer options, row group limit and statistics from the
    footer) with what it derives from the schema taken from the layout, once per process."""

    def __init__(self, output: OutputFile, layout: FileLayout) -> None:
        self._output = output
        self._layout = layout
        self._stream: OutputStream | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, rows: pa.Table) -> None:
        if self._writer is None:
            stream = self._output.create(overwrite=True)
            try:
                self._writer = pq.ParquetWriter(
                    stream, schema=rows.schema, store_decimal_as_integer=True, **self._layout.writer_options
                )
            except Exception:
                stream.close()
                raise
            self._stream = stream
        self._writer.write(rows, row_group_size=self._layout.row_group_rows)

    def close(self) -> DataFileStatistics:
        if self._writer is None or self._stream is None:
            raise ValueError("a Parquet file closed before any row was written to it")
        with self._stream:
            self._writer.close()
            return data_file_statistics_from_parquet_metadata(
                parquet_metadata=self._writer.writer.metadata,
                stats_columns=self._layout.statistics,
                parquet_column_mapping=self._layout.column_ids,
            )
