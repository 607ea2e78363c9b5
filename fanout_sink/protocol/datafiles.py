"""Arrow rows -> Parquet data files of one Iceberg table, and data files <-> control-topic records.

Workers write files on executors; only the coordinator appends them, in the driver, possibly after
a restart. So a data file has to travel through the control topic with everything Iceberg needs to
append it without reopening the file: partition values, metrics and bounds. Partition values and
bounds use Iceberg's single-value binary encoding, so the record is independent of Python types.

File names carry a fresh uuid per call (PyIceberg names files ``00000-<task>-<write uuid>``): two
attempts of the same slice never overwrite each other's files, and a crashed attempt leaves only
orphans that no snapshot references.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record
from pyiceberg.types import PrimitiveType

from fanout_sink.errors import TableError
from fanout_sink.protocol import events as ev
from fanout_sink.pyiceberg_internals import arrow_writes


def write_data_files(table: Table, rows: pa.Table) -> list[DataFile]:
    """Write ``rows`` (already in the table's schema) as data files under the table's location.

    Returns PyIceberg ``DataFile`` objects with Iceberg field ids, metrics and partition values.
    Nothing is committed: the files stay invisible until the coordinator appends them.
    """
    if rows.num_rows == 0:
        return []
    metadata = table.metadata
    arrow_writes.check_schema_compatible(metadata, rows.schema)
    files = arrow_writes.dataframe_to_data_files(metadata, rows, table.io, uuid.uuid4())
    for data_file in files:
        # PyIceberg 0.12 drops spec_id in DataFile.from_args (it is not a manifest field): the files
        # were written with the table's default spec, so record that.
        data_file.spec_id = metadata.default_spec_id
    return files


def write_key_file(table: Table, keys: pa.Table) -> ev.KeyFile:
    """Write a change table's deleted keys beside its data files, for the coordinator to resolve.

    Deletes are resolved into position deletes only when the table is committed (the rows they hit
    are known then, not now), so the keys travel as a file: a slice may delete many keys and the
    control topic's messages stay small. The file is never part of the table; once the round that
    resolved it is committed, orphan cleanup takes it like any unreferenced file.
    """
    path, size = write_parquet(table, keys, f"deleted-keys-{uuid.uuid4()}.parquet")
    return ev.KeyFile(file_path=path, record_count=keys.num_rows, file_size_in_bytes=size)


def write_parquet(table: Table, rows: pa.Table, name: str) -> tuple[str, int]:
    """``rows`` as one new Parquet file ``name`` under the table's data location: (path, size).

    Written whole from memory and never overwriting, so a name clash fails instead of replacing a
    file some snapshot may reference."""
    buffer = pa.BufferOutputStream()
    pq.write_table(rows, buffer)
    data = buffer.getvalue().to_pybytes()
    path = table.location_provider().new_data_location(name)
    with table.io.new_output(path).create(overwrite=False) as stream:
        stream.write(data)
    return path, len(data)


def read_key_files(table: Table, key: Sequence[str], files: Sequence[ev.KeyFile]) -> pa.Table:
    """The deleted keys of ``files`` as one table of the ``key`` columns in ``table``'s current types
    (a key column may have been widened since the worker wrote them)."""
    target = table.schema().as_arrow()
    schema = pa.schema([target.field(name) for name in key])
    parts = []
    for key_file in files:
        with table.io.new_input(key_file.file_path).open() as stream:
            parts.append(pq.read_table(stream).select(list(key)).cast(schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def rewrite_data_files(table: Table, paths: Sequence[str]) -> list[DataFile]:
    """The rows of data files written for another table (a dropped one) as new files of ``table``.

    Columns are matched by name, not by field id (a recreated table numbers its fields anew) and
    cast to ``table``'s types. Raises :class:`TableError` when the rows do not fit: a column the
    table lacks (its data would be lost), a required column missing or null, or a cast that fails.
    """
    target = table.schema().as_arrow()
    parts = []
    for path in paths:
        with table.io.new_input(path).open() as stream:
            parts.append(_conform(pq.read_table(stream), target, path, table.name()))
    return write_data_files(table, pa.concat_tables(parts)) if parts else []


def _conform(rows: pa.Table, target: pa.Schema, path: str, table: tuple[str, ...]) -> pa.Table:
    name = ".".join(table)
    extra = [c for c in rows.column_names if c not in target.names]
    if extra:
        raise TableError(f"{path}: column(s) {extra} are not in table {name}")
    columns = []
    for column in target:
        if column.name not in rows.column_names:
            if not column.nullable:
                raise TableError(f"{path}: required column {column.name} of table {name} is missing")
            columns.append(pa.nulls(rows.num_rows, column.type))
            continue
        values = rows[column.name]
        if not column.nullable and values.null_count:
            raise TableError(f"{path}: required column {column.name} of table {name} has nulls")
        try:
            columns.append(values.cast(column.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TableError(f"{path}: column {column.name} does not fit table {name}: {exc}") from exc
    return pa.Table.from_arrays(columns, schema=target)


def _partition_fields(table: Table, spec_id: int) -> list[tuple[int, PrimitiveType]]:
    """Field id and type of each partition field of spec ``spec_id`` (transforms yield primitives)."""
    found = []
    for f in table.specs()[spec_id].partition_type(table.schema()).fields:
        if not isinstance(f.field_type, PrimitiveType):
            raise TypeError(
                f"partition field {f.name} of {table.name()} has non-primitive type {f.field_type}"
            )
        found.append((f.field_id, f.field_type))
    return found


def to_record(data_file: DataFile, table: Table) -> ev.DataFileRecord:
    """A PyIceberg ``DataFile`` of ``table`` as the Avro-ready record carried by ``DataWritten``."""
    spec_id = int(data_file.spec_id)
    partition = tuple(
        ev.PartitionValue(
            field_id=field_id,
            value=None if data_file.partition[i] is None else to_bytes(field_type, data_file.partition[i]),
        )
        for i, (field_id, field_type) in enumerate(_partition_fields(table, spec_id))
    )
    return ev.DataFileRecord(
        file_path=data_file.file_path,
        file_format=data_file.file_format.value,
        spec_id=spec_id,
        partition=partition,
        record_count=data_file.record_count,
        file_size_in_bytes=data_file.file_size_in_bytes,
        column_sizes=dict(data_file.column_sizes or {}),
        value_counts=dict(data_file.value_counts or {}),
        null_value_counts=dict(data_file.null_value_counts or {}),
        nan_value_counts=dict(data_file.nan_value_counts or {}),
        lower_bounds=dict(data_file.lower_bounds or {}),
        upper_bounds=dict(data_file.upper_bounds or {}),
        split_offsets=tuple(data_file.split_offsets) if data_file.split_offsets is not None else None,
        sort_order_id=data_file.sort_order_id,
    )


def from_record(record: ev.DataFileRecord, table: Table) -> DataFile:
    """The PyIceberg ``DataFile`` to append to ``table`` (the one the file was written for)."""
    by_id = {p.field_id: p.value for p in record.partition}
    values = [
        None if (raw := by_id.get(field_id)) is None else from_bytes(field_type, raw)
        for field_id, field_type in _partition_fields(table, record.spec_id)
    ]
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=record.file_path,
        file_format=FileFormat(record.file_format),
        partition=Record(*values),
        record_count=record.record_count,
        file_size_in_bytes=record.file_size_in_bytes,
        column_sizes=dict(record.column_sizes),
        value_counts=dict(record.value_counts),
        null_value_counts=dict(record.null_value_counts),
        nan_value_counts=dict(record.nan_value_counts),
        lower_bounds=dict(record.lower_bounds),
        upper_bounds=dict(record.upper_bounds),
        key_metadata=None,
        split_offsets=list(record.split_offsets) if record.split_offsets is not None else None,
        equality_ids=None,
        sort_order_id=record.sort_order_id,
    )
    data_file.spec_id = record.spec_id
    return data_file
