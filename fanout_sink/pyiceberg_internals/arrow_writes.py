"""Arrow rows and schemas as PyIceberg's append writes them into a table: typed, public wrappers of
PyIceberg's private writer functions, so the sink's own writers produce files equal to PyIceberg's.

What it reaches into: ``pyiceberg.io.pyarrow``'s ``_check_pyarrow_schema_compatible``,
``_dataframe_to_data_files``, ``_determine_partitions``, ``_to_requested_schema`` and
``_get_parquet_writer_kwargs``, and ``Catalog._convert_schema_if_needed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.io.fileformat import FileFormatModel
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    _dataframe_to_data_files,
    _determine_partitions,
    _get_parquet_writer_kwargs,
    _to_requested_schema,
)
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata


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
