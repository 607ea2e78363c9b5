"""A change table's round: its changes resolved into Iceberg v2 position deletes, committed with
the new rows in one snapshot (invariant I7).

Why position deletes, resolved when the table is committed: the rows a change replaces are known
only then (workers run in parallel, long before), and position deletes are the one row-level delete
both PyIceberg 0.12 and Spark read (PyIceberg refuses equality deletes). Unlike equality deletes they
apply to data files of the same sequence number, so a delete may point at a row committed in the
same snapshot: a key changed twice in one round leaves one row.

``resolve`` reads one snapshot of the table; the commit asserts that snapshot is still current, so
a compaction or another writer in between fails the commit and the caller resolves again. A delete
can never point at a file a rewrite removed, nor miss a row a rewrite moved.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from fanout_sink.errors import TableError
from fanout_sink.protocol.append import SpecPreservingAppend

FILE_PATH_ID = 2147483546
"""Iceberg's reserved field id of a position-delete file's ``file_path`` column."""
POS_ID = 2147483545
"""Iceberg's reserved field id of a position-delete file's ``pos`` column."""
_FIELD_ID = b"PARQUET:field_id"
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={_FIELD_ID: str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={_FIELD_ID: str(POS_ID).encode()}),
    ]
)
_SEQ, _PATH, _POS, _DELETE = "_seq", "file_path", "pos", "_delete"
"""Working columns; a key column of these names is refused (see ``_check_key``)."""


@dataclass(frozen=True)
class ChangeSet:
    """One slice's changes of a table, as the worker wrote them (at most one row per key)."""

    data_files: Sequence[DataFile]
    deleted_keys: pa.Table
    """The key columns of the keys whose last change in the slice deletes them."""


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


def _check_table(table: Table, key: Sequence[str]) -> list[NestedField]:
    name = ".".join(table.name())
    version = table.metadata.format_version
    if version != 2:
        raise TableError(
            f"table {name} is an Iceberg v{version} table; a change table needs format v2 (position "
            "deletes; PyIceberg 0.12 cannot write v3 deletion vectors).\n  fix: "
            + (
                "upgrade it: ALTER TABLE ... SET TBLPROPERTIES ('format-version'='2')"
                if version == 1
                else "use a v2 table for this route"
            )
        )
    schema = table.schema()
    fields = []
    for column in key:
        if column in (_SEQ, _PATH, _POS, _DELETE):
            raise TableError(f"table {name}: key column {column!r} clashes with a working column; rename it")
        found = schema.find_field(column)
        if not found.field_type.is_primitive:
            raise TableError(f"table {name}: key column {column!r} is not a primitive column")
        fields.append(found)
    return fields


def _key_types(schema: Schema, fields: list[NestedField]) -> pa.Schema:
    arrow = schema.as_arrow()
    return pa.schema([arrow.field(f.name).with_nullable(True) for f in fields])


def _read_keys(io: FileIO, path: str, fields: list[NestedField], types: pa.Schema) -> pa.Table:
    """The key columns of one data file, matched by field id (a renamed column keeps its id), with
    each row's position in the file."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = {
            int(f.metadata[_FIELD_ID]): f.name
            for f in parquet.schema_arrow
            if f.metadata is not None and _FIELD_ID in f.metadata
        }
        names = [by_id.get(f.field_id, f.name) for f in fields]
        keys = parquet.read(columns=names)
    keys = keys.rename_columns([f.name for f in fields]).cast(types)
    return keys.append_column(_PATH, pa.array([path] * keys.num_rows, pa.string())).append_column(
        _POS, pa.array(range(keys.num_rows), pa.int64())
    )


def _key_range(mentioned: pa.Table, fields: list[NestedField]) -> BooleanExpression:
    """A filter that keeps every data file whose key-column bounds may hold a mentioned key.

    It never uses the new rows' partitions: a key whose partition column changed must still be found
    in its old partition. Partition pruning happens only through the key columns themselves.
    """
    expression: BooleanExpression = AlwaysTrue()
    for f in fields:
        bounds = pc.min_max(mentioned[f.name]).as_py()
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


def _live_rows(
    table: Table, mentioned: pa.Table, fields: list[NestedField], types: pa.Schema
) -> tuple[pa.Table, dict[str, DataFile]]:
    """Rows of the table's current snapshot whose key is mentioned (key, file_path, pos), without
    positions an existing delete file already removed; and the data files they are in."""
    names = [f.name for f in fields]
    if table.current_snapshot() is None or mentioned.num_rows == 0:
        return _empty(types), {}
    tasks = list(table.scan(row_filter=_key_range(mentioned, fields)).plan_files())
    files = {task.file.file_path: task.file for task in tasks}
    wanted = mentioned.select(names).group_by(names).aggregate([])
    found, deleted_files = [], {}
    for task in tasks:
        keys = _read_keys(table.io, task.file.file_path, fields, types)
        hits = keys.join(wanted, keys=names, join_type="inner")
        if hits.num_rows:
            found.append(hits)
            deleted_files.update({d.file_path: d for d in task.delete_files})
    if not found:
        return _empty(types), files
    rows = pa.concat_tables(found)
    if deleted_files:
        gone = (
            pa.concat_tables(_read_position_deletes(table.io, path) for path in sorted(deleted_files))
            .group_by([_PATH, _POS])
            .aggregate([])
        )
        rows = rows.join(gone, keys=[_PATH, _POS], join_type="left anti")
    return rows, files


def _empty(types: pa.Schema) -> pa.Table:
    return pa.schema([*types, pa.field(_PATH, pa.string()), pa.field(_POS, pa.int64())]).empty_table()


def _read_position_deletes(io: FileIO, path: str) -> pa.Table:
    with io.new_input(path).open() as stream:
        return pq.read_table(stream, columns=[_PATH, _POS]).cast(
            pa.schema([pa.field(_PATH, pa.string()), pa.field(_POS, pa.int64())])
        )


def resolve(table: Table, key: Sequence[str], changes: Sequence[ChangeSet]) -> Resolution:
    """The position deletes that make ``changes`` (in commit order, older first) the keys' last
    state in ``table``: per key, the last change set mentioning it wins; every other copy (a live
    row of the table, or a row of an earlier change set) is deleted. Writes the delete files."""
    fields = _check_table(table, key)
    names = [f.name for f in fields]
    types = _key_types(table.schema(), fields)
    new_files: dict[str, DataFile] = {}
    rows, deletes = [], []
    for seq, change in enumerate(changes):
        for data_file in change.data_files:
            new_files[data_file.file_path] = data_file
            keys = _read_keys(table.io, data_file.file_path, fields, types)
            rows.append(keys.append_column(_SEQ, pa.array([seq] * keys.num_rows, pa.int64())))
        if change.deleted_keys.num_rows:
            keys = change.deleted_keys.select(names).cast(types)
            deletes.append(keys.append_column(_SEQ, pa.array([seq] * keys.num_rows, pa.int64())))
    new_rows = pa.concat_tables(rows) if rows else _empty(types).append_column(_SEQ, pa.array([], pa.int64()))
    mentioned = pa.concat_tables(
        [
            new_rows.select([*names, _SEQ]).append_column(_DELETE, pa.array([False] * new_rows.num_rows)),
            *(d.append_column(_DELETE, pa.array([True] * d.num_rows)) for d in deletes),
        ]
    )
    if mentioned.num_rows == 0:
        return Resolution(delete_files=[])
    # The winning change of each key: its last change set, and whether that change deletes it.
    last = mentioned.group_by(names).aggregate([(_SEQ, "max")]).rename_columns([*names, _SEQ])
    winners = last.join(mentioned, keys=[*names, _SEQ], join_type="inner")

    live, live_files = _live_rows(table, mentioned, fields, types)
    superseded = new_rows.join(last.rename_columns([*names, "_last"]), keys=names, join_type="inner")
    superseded = superseded.filter(pc.less(superseded[_SEQ], superseded["_last"]))
    targets = pa.concat_tables([live.select([_PATH, _POS]), superseded.select([_PATH, _POS])])

    live_keys = live.select(names).group_by(names).aggregate([])
    upserts = winners.filter(pc.invert(winners[_DELETE])).select(names)
    updated = upserts.join(live_keys, keys=names, join_type="inner").num_rows
    dropped = winners.filter(winners[_DELETE]).select(names)
    resolution = Resolution(
        delete_files=_write_delete_files(table, targets, {**live_files, **new_files}),
        inserted=upserts.num_rows - updated,
        updated=updated,
        deleted=live.select(names).join(dropped, keys=names, join_type="inner").num_rows,
        position_deletes=targets.num_rows,
    )
    return resolution


def _write_delete_files(table: Table, targets: pa.Table, files: dict[str, DataFile]) -> list[DataFile]:
    """One position-delete file per partition (and spec) of the data files hit, sorted by path and
    position as the spec requires. Fewer, larger files than one per data file: a round of random
    updates touches most files of a partition, and readers open every delete file of a scan."""
    if targets.num_rows == 0:
        return []
    groups: dict[tuple[int, tuple[object, ...]], list[str]] = defaultdict(list)
    for path in pc.unique(targets[_PATH]).to_pylist():
        data_file = files[path]
        groups[
            (int(data_file.spec_id), tuple(data_file.partition[i] for i in range(len(data_file.partition))))
        ].append(path)
    written = []
    for (spec_id, partition), paths in sorted(groups.items(), key=lambda g: min(g[1])):
        part = targets.filter(pc.is_in(targets[_PATH], pa.array(paths, pa.string())))
        part = part.sort_by([(_PATH, "ascending"), (_POS, "ascending")]).cast(POSITION_DELETE_SCHEMA)
        written.append(_write_delete_file(table, part, spec_id, partition))
    return written


def _write_delete_file(table: Table, rows: pa.Table, spec_id: int, partition: tuple[object, ...]) -> DataFile:
    buffer = pa.BufferOutputStream()
    pq.write_table(rows, buffer)
    data = buffer.getvalue().to_pybytes()
    path = table.location_provider().new_data_location(f"{uuid.uuid4()}-deletes.parquet")
    with table.io.new_output(path).create(overwrite=False) as stream:
        stream.write(data)
    paths, positions = rows[_PATH], rows[_POS]
    # Bounds of file_path are never truncated: equal bounds tell readers the file deletes from one
    # data file only (PyIceberg's delete index and Iceberg's referencedDataFile use them).
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        record_count=rows.num_rows,
        file_size_in_bytes=len(data),
        column_sizes={},
        value_counts={FILE_PATH_ID: rows.num_rows, POS_ID: rows.num_rows},
        null_value_counts={FILE_PATH_ID: 0, POS_ID: 0},
        nan_value_counts={},
        lower_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[0].as_py()),
            POS_ID: to_bytes(LongType(), pc.min(positions).as_py()),
        },
        upper_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[-1].as_py()),
            POS_ID: to_bytes(LongType(), pc.max(positions).as_py()),
        },
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
    )
    delete_file.spec_id = spec_id
    return delete_file


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

    def add_delete_file(self, delete_file: DataFile) -> RowDelta:
        if delete_file.content != DataFileContent.POSITION_DELETES:
            raise ValueError(f"{delete_file.file_path} is not a position-delete file")
        self._added_delete_files.append(delete_file)
        self._operation = Operation.OVERWRITE
        return self

    def _deletes_by_spec(self) -> dict[int, list[DataFile]]:
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for delete_file in self._added_delete_files:
            by_spec[delete_file.spec_id].append(delete_file)
        return dict(sorted(by_spec.items()))

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
            with writer:
                for delete_file in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=delete_file,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        return manifests

    def _collect(self, collector: SnapshotSummaryCollector, schema: Schema) -> None:
        super()._collect(collector, schema)
        for spec_id, files in self._deletes_by_spec().items():
            spec: PartitionSpec = self.spec(spec_id)
            for delete_file in files:
                collector.add_file(data_file=delete_file, partition_spec=spec, schema=schema)
