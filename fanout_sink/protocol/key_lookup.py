"""Which live rows of a change table hold given keys: the look-up behind a round's position deletes.

``row_delta.resolve`` decides per key which change wins; the rows it must delete are the live rows of
the table's current snapshot that hold a mentioned key. Finding them is pruned three ways, each
sound for a row that changed partition: PyIceberg's scan planning with a key-range filter (partition
pruning only through transforms of the key columns, never the new rows' partitions), then each
file's key-column bounds against the mentioned keys (a key is looked for only in files whose bounds
box holds it), and only the key columns are read, by field id. Everything per row is Arrow (joins,
sorts); Python loops run per file.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import NestedField, PrimitiveType
from pyiceberg.utils.concurrent import ExecutorFactory

from fanout_sink.errors import TableError
from fanout_sink.protocol import position_deletes

FILE, POS = "_file", "_pos"
"""Columns of key rows beside the key columns: the index of the row's data file in the caller's list
of files, and the row's position in that file. A key column of these names is refused."""


@dataclass(frozen=True)
class KeyColumns:
    """A change table's key columns as its current schema has them."""

    fields: tuple[NestedField, ...]
    types: pa.Schema
    """Their Arrow types, nullable: key rows of every data file and deleted keys are cast to them."""

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]


def key_columns(table: Table, key: Sequence[str], working: Sequence[str] = ()) -> KeyColumns:
    """The key columns of ``table``; a :class:`TableError` unless the table can take position
    deletes (format v2) and each key column is a top-level primitive column named neither
    :data:`FILE`, :data:`POS` nor one of the caller's own ``working`` columns."""
    name = ".".join(table.name())
    version = table.metadata.format_version
    if version == 1:
        raise TableError(
            f"table {name} is an Iceberg v1 table; a change table needs format v2 (v1 has no "
            "row-level deletes).\n  fix: upgrade it with table property format-version=2 (Spark SQL: "
            f"ALTER TABLE {name} SET TBLPROPERTIES ('format-version'='2')); the upgrade is in place"
        )
    if version != 2:
        raise TableError(
            f"table {name} is an Iceberg v{version} table; a change table needs format v2: v3 forbids "
            "position-delete files (deletion vectors instead), and PyIceberg 0.12 cannot write v3 "
            "metadata or deletion vectors.\n  fix: route these changes to a format-version=2 table"
        )
    schema = table.schema()
    fields = []
    for column in key:
        if column in (FILE, POS, *working):
            raise TableError(f"table {name}: key column {column!r} clashes with a working column; rename it")
        found = schema.find_field(column)
        if not found.field_type.is_primitive or column not in schema.as_arrow().names:
            raise TableError(f"table {name}: key column {column!r} is not a top-level primitive column")
        fields.append(found)
    arrow = schema.as_arrow()
    return KeyColumns(tuple(fields), pa.schema([arrow.field(f.name).with_nullable(True) for f in fields]))


def read_keys(io: FileIO, path: str, key: KeyColumns, index: int) -> pa.Table:
    """The key columns of one data file, matched by field id (a renamed column keeps its id), with
    the file's index and each row's position in the file."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = {
            int(f.metadata[position_deletes.FIELD_ID]): f.name
            for f in parquet.schema_arrow
            if f.metadata is not None and position_deletes.FIELD_ID in f.metadata
        }
        keys = parquet.read(columns=[by_id.get(f.field_id, f.name) for f in key.fields])
    rows = keys.num_rows
    keys = keys.rename_columns(key.names).cast(key.types)
    return keys.append_column(FILE, pa.array(np.full(rows, index, dtype=np.int32))).append_column(
        POS, pa.array(np.arange(rows, dtype=np.int64))
    )


def _key_range(wanted: pa.Table, fields: Sequence[NestedField]) -> BooleanExpression:
    """A scan filter that keeps every data file whose key-column bounds may hold a wanted key.

    It never uses the new rows' partitions: a key whose partition column changed must still be found
    in its old partition. Partition pruning happens only through the key columns themselves.
    """
    expression: BooleanExpression = AlwaysTrue()
    for f in fields:
        bounds = pc.min_max(wanted[f.name]).as_py()
        if bounds["min"] is None:
            continue
        expression = And(expression, _between(f.name, bounds["min"], bounds["max"]))
    return expression


def _between(column: str, low: object, high: object) -> BooleanExpression:
    # PyIceberg's predicates are pydantic models: mypy reads their fields (term, value), not the
    # positional __init__ (term, literal) they really take.
    return And(
        GreaterThanOrEqual(column, low),  # type: ignore[call-arg, misc, arg-type]
        LessThanOrEqual(column, high),  # type: ignore[call-arg, misc, arg-type]
    )


def _may_hold(data_file: DataFile, wanted: pa.Table, fields: Sequence[NestedField]) -> bool:
    """Whether some wanted key lies inside the file's key-column bounds box (all columns at once).

    Truncated string bounds stay sound (a lower bound is a prefix, an upper one rounded up); a file
    without bounds, or whose bounds do not decode as today's type (a promoted column), is read.
    """
    inside = None
    for f in fields:
        lower = (data_file.lower_bounds or {}).get(f.field_id)
        upper = (data_file.upper_bounds or {}).get(f.field_id)
        if lower is None or upper is None or not isinstance(f.field_type, PrimitiveType):
            continue
        column = wanted[f.name]
        try:
            low = pa.scalar(from_bytes(f.field_type, lower), column.type)
            high = pa.scalar(from_bytes(f.field_type, upper), column.type)
        except (ValueError, TypeError, struct.error, pa.ArrowException):
            continue
        mask = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
        inside = mask if inside is None else pc.and_(inside, mask)
    return inside is None or bool(pc.any(inside).as_py())


def _plan(table: Table, wanted: pa.Table, fields: Sequence[NestedField]) -> list[FileScanTask]:
    """The current snapshot's data files the wanted keys may be in, with their delete files."""
    try:
        return list(table.scan(row_filter=_key_range(wanted, fields)).plan_files())
    except ValueError as exc:
        if "equality deletes" not in str(exc):
            raise
        name = ".".join(table.name())
        raise TableError(
            f"table {name} has equality-delete files (another writer wrote them: Flink, or a Kafka "
            "Connect sink in upsert mode); PyIceberg 0.12 cannot read them, so the keys the changes "
            "replace cannot be found.\n  fix: fold them into the data files with Spark: CALL "
            f"<catalog>.system.rewrite_data_files(table => '{name}', options => "
            "map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true')); and let only this "
            "sink write the table's changes"
        ) from exc


def live_rows(table: Table, wanted: pa.Table, key: KeyColumns, files: list[DataFile]) -> pa.Table:
    """Rows of the table's current snapshot whose key is wanted (key, _file, _pos), without positions
    an existing delete file already removed. The data files read are appended to ``files``."""
    names = key.names
    empty = no_rows(key)
    if table.current_snapshot() is None or wanted.num_rows == 0:
        return empty
    candidates = [
        task for task in _plan(table, wanted, key.fields) if _may_hold(task.file, wanted, key.fields)
    ]
    first = len(files)
    files.extend(task.file for task in candidates)

    def hits(number: int) -> pa.Table:
        keys = read_keys(table.io, files[number].file_path, key, number)
        return keys.join(wanted, keys=names, join_type="left semi")

    # Files are read side by side, as PyIceberg's own scans do (Arrow releases the GIL).
    executor = ExecutorFactory.get_or_create()
    results = list(executor.map(hits, range(first, len(files))))
    found = [rows for rows in results if rows.num_rows]
    delete_paths = {
        d.file_path
        for task, rows in zip(candidates, results, strict=True)
        if rows.num_rows
        for d in task.delete_files
    }
    if not found:
        return empty
    rows = pa.concat_tables(found)
    if delete_paths:
        gone = pa.concat_tables(executor.map(partial(position_deletes.read, table.io), sorted(delete_paths)))
        known = pa.array([f.file_path for f in files], pa.string())
        index = pc.index_in(gone[position_deletes.PATH], value_set=known).cast(pa.int32())
        gone_rows = pa.table({FILE: index, POS: gone[position_deletes.POS]}).drop_null()
        gone_rows = gone_rows.group_by([FILE, POS]).aggregate([])
        rows = rows.join(gone_rows, keys=[FILE, POS], join_type="left anti")
    return rows


def no_rows(key: KeyColumns) -> pa.Table:
    """An empty table of key rows (key columns, :data:`FILE`, :data:`POS`)."""
    return pa.schema([*key.types, pa.field(FILE, pa.int32()), pa.field(POS, pa.int64())]).empty_table()
