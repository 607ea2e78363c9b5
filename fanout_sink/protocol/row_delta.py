"""A change table's round: its changes resolved into Iceberg v2 position deletes, committed with
the new rows in one snapshot (invariant I7).

Why position deletes, resolved when the table is committed: the rows a change replaces are known
only then (workers run in parallel, long before), and position deletes are the one row-level delete
both PyIceberg 0.12 and Spark read (PyIceberg refuses equality deletes). Unlike equality deletes they
apply to data files of the same sequence number, so a delete may point at a row committed in the
same snapshot: a key changed twice in one round leaves one row.

``resolve`` reads one snapshot of the table; ``RowDelta``'s commit asserts that snapshot is still the
branch head (and refuses PyIceberg's rebasing retry), so a compaction or another writer in between
fails the commit and the caller resolves again. A delete can never point at a file a rewrite
removed, nor miss a row a rewrite moved.

The look-up is pruned three ways, each sound for a row that changed partition: PyIceberg's scan
planning with a key-range filter (partition pruning only through transforms of the key columns,
never the new rows' partitions), then each file's key-column bounds against the mentioned keys
(a key is looked for only in files whose bounds box holds it), and only the key columns are read,
by field id. Everything per row is Arrow (joins, sorts); Python loops run per file.
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
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector
from pyiceberg.types import NestedField, PrimitiveType
from pyiceberg.utils.concurrent import ExecutorFactory

from fanout_sink.errors import TableError
from fanout_sink.protocol import position_deletes
from fanout_sink.protocol.append import SpecPreservingAppend, by_spec

_SEQ, _FILE, _POS, _DELETE = "_seq", "_file", "_pos", "_delete"
"""Working columns beside the key columns; a key column of these names is refused."""


@dataclass(frozen=True)
class ChangeSet:
    """One slice's changes of a table, as the worker wrote them."""

    data_files: Sequence[DataFile]
    """New data files (not committed); at most one row per key within the set."""
    deleted_keys: pa.Table
    """The key columns of the keys whose last change in the slice deletes them; may be empty."""


@dataclass
class Resolution:
    """The position deletes a round needs, written but not committed, and what they do per key."""

    delete_files: list[DataFile]
    inserted: int = 0
    """Keys whose final row is new to the table."""
    updated: int = 0
    """Keys whose final row replaces a live row."""
    deleted: int = 0
    """Live rows removed by deleted keys."""
    position_deletes: int = 0
    """Rows the delete files remove: live rows of the table and superseded rows of this round."""


def _check_table(table: Table, key: Sequence[str]) -> list[NestedField]:
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
        if column in (_SEQ, _FILE, _POS, _DELETE):
            raise TableError(f"table {name}: key column {column!r} clashes with a working column; rename it")
        found = schema.find_field(column)
        if not found.field_type.is_primitive or column not in schema.as_arrow().names:
            raise TableError(f"table {name}: key column {column!r} is not a top-level primitive column")
        fields.append(found)
    return fields


def _key_types(schema: Schema, fields: list[NestedField]) -> pa.Schema:
    arrow = schema.as_arrow()
    return pa.schema([arrow.field(f.name).with_nullable(True) for f in fields])


def _read_keys(io: FileIO, path: str, fields: list[NestedField], types: pa.Schema, index: int) -> pa.Table:
    """The key columns of one data file, matched by field id (a renamed column keeps its id), with
    the file's index and each row's position in the file."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = {
            int(f.metadata[position_deletes.FIELD_ID]): f.name
            for f in parquet.schema_arrow
            if f.metadata is not None and position_deletes.FIELD_ID in f.metadata
        }
        keys = parquet.read(columns=[by_id.get(f.field_id, f.name) for f in fields])
    rows = keys.num_rows
    keys = keys.rename_columns([f.name for f in fields]).cast(types)
    return keys.append_column(_FILE, pa.array(np.full(rows, index, dtype=np.int32))).append_column(
        _POS, pa.array(np.arange(rows, dtype=np.int64))
    )


def _key_range(wanted: pa.Table, fields: list[NestedField]) -> BooleanExpression:
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


def _may_hold(data_file: DataFile, wanted: pa.Table, fields: list[NestedField]) -> bool:
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


def _plan(table: Table, wanted: pa.Table, fields: list[NestedField]) -> list[FileScanTask]:
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


def _live_rows(
    table: Table, wanted: pa.Table, fields: list[NestedField], types: pa.Schema, files: list[DataFile]
) -> pa.Table:
    """Rows of the table's current snapshot whose key is wanted (key, _file, _pos), without positions
    an existing delete file already removed. The data files read are appended to ``files``."""
    names = [f.name for f in fields]
    empty = _empty(types)
    if table.current_snapshot() is None or wanted.num_rows == 0:
        return empty
    candidates = [task for task in _plan(table, wanted, fields) if _may_hold(task.file, wanted, fields)]
    first = len(files)
    files.extend(task.file for task in candidates)

    def hits(number: int) -> pa.Table:
        keys = _read_keys(table.io, files[number].file_path, fields, types, number)
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
        gone_rows = pa.table({_FILE: index, _POS: gone[position_deletes.POS]}).drop_null()
        gone_rows = gone_rows.group_by([_FILE, _POS]).aggregate([])
        rows = rows.join(gone_rows, keys=[_FILE, _POS], join_type="left anti")
    return rows


def _empty(types: pa.Schema) -> pa.Table:
    return pa.schema([*types, pa.field(_FILE, pa.int32()), pa.field(_POS, pa.int64())]).empty_table()


def _with(rows: pa.Table, name: str, value: int | bool) -> pa.Table:
    """``rows`` with a constant column (built in numpy, not per row)."""
    array = np.full(rows.num_rows, value, dtype=np.bool_ if isinstance(value, bool) else np.int64)
    return rows.append_column(name, pa.array(array))


def resolve(table: Table, key: Sequence[str], changes: Sequence[ChangeSet]) -> Resolution:
    """The position deletes that make ``changes`` (in commit order, older first) the keys' last
    state in ``table``: per key, the last change set mentioning it wins; every other copy (a live
    row of the table's current snapshot, or a row of an earlier change set) is deleted. Writes the
    delete files; commits nothing."""
    fields = _check_table(table, key)
    names = [f.name for f in fields]
    types = _key_types(table.schema(), fields)
    files: list[DataFile] = []
    rows, deletes = [], []
    for seq, change in enumerate(changes):
        for data_file in change.data_files:
            keys = _read_keys(table.io, data_file.file_path, fields, types, len(files))
            rows.append(_with(keys, _SEQ, seq))
            files.append(data_file)
        if change.deleted_keys.num_rows:
            deletes.append(_with(change.deleted_keys.select(names).cast(types), _SEQ, seq))
    new_rows = pa.concat_tables(rows) if rows else _with(_empty(types), _SEQ, 0)
    mentioned = pa.concat_tables(
        [_with(new_rows.select([*names, _SEQ]), _DELETE, False), *(_with(d, _DELETE, True) for d in deletes)]
    )
    if mentioned.num_rows == 0:
        return Resolution(delete_files=[])
    # The winning change of each key: its last change set, and whether that change deletes it.
    last = mentioned.group_by(names).aggregate([(_SEQ, "max")]).rename_columns([*names, _SEQ])
    winners = last.join(mentioned, keys=[*names, _SEQ], join_type="inner")
    if winners.num_rows != last.num_rows:
        raise TableError(
            f"table {'.'.join(table.name())}: {winners.num_rows - last.num_rows} key(s) appear twice in "
            f"one change set (two rows, or a row and a delete) of key {names}: a slice must keep one "
            "last change per key.\n  fix: this is a bug of the worker's per-slice de-duplication; "
            "report it with the table's pending files"
        )

    live = _live_rows(table, last.select(names), fields, types, files)
    superseded = new_rows.join(last.rename_columns([*names, "_last"]), keys=names, join_type="inner")
    superseded = superseded.filter(pc.less(superseded[_SEQ], superseded["_last"]))
    targets = pa.concat_tables([live.select([_FILE, _POS]), superseded.select([_FILE, _POS])])

    live_keys = live.select(names).group_by(names).aggregate([])
    upserts = winners.filter(pc.invert(winners[_DELETE])).select(names)
    updated = upserts.join(live_keys, keys=names, join_type="left semi").num_rows
    dropped = winners.filter(winners[_DELETE]).select(names)
    return Resolution(
        delete_files=position_deletes.write(
            table, files, targets[_FILE].combine_chunks(), targets[_POS].combine_chunks()
        ),
        inserted=upserts.num_rows - updated,
        updated=updated,
        deleted=live.select(names).join(dropped, keys=names, join_type="left semi").num_rows,
        position_deletes=targets.num_rows,
    )


class _DeleteManifestWriter(ManifestWriterV2):
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
