"""Change sets resolved into position deletes and committed in one snapshot, read back by PyIceberg.

No broker: data files are written as a worker writes them (``datafiles.write_data_files``), resolved
by ``row_delta.resolve`` and committed with ``pyiceberg_internals.snapshots.RowDelta`` as the
coordinator does. Every check reads the whole table back and compares it with what the changes mean
key by key.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DateType,
    DecimalType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestamptzType,
)
from support.row_deltas import commit_round, staged

from fanout_sink.errors import TableError
from fanout_sink.protocol import datafiles, key_lookup, row_delta
from fanout_sink.pyiceberg_internals import snapshots

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "v", LongType(), required=False),
    NestedField(4, "ts", TimestamptzType(), required=False),
    identifier_field_ids=[1],
)
ARROW = SCHEMA.as_arrow()
DAY0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = ["id"]

Row = tuple[str, int]
"""(region, v) of a key's live row."""


def _catalog(folder: Path) -> SqlCatalog:
    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder / 'warehouse'}"
    )
    catalog.create_namespace("ns")
    return catalog


@pytest.fixture
def lake(tmp_path: Path) -> SqlCatalog:
    return _catalog(tmp_path)


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose key columns resolution reads, in order."""
    paths: list[str] = []
    original = key_lookup.read_keys

    def spy(io: Any, path: str, *args: Any) -> pa.Table:
        paths.append(path)
        return original(io, path, *args)

    monkeypatch.setattr(key_lookup, "read_keys", spy)
    return paths


def _create(catalog: Catalog, partitioned_by: str | None = None, version: int = 2) -> Table:
    spec = PartitionSpec()
    if partitioned_by == "region":
        spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    elif partitioned_by == "day":
        spec = PartitionSpec(PartitionField(4, 1000, DayTransform(), "ts_day"))
    return catalog.create_table(
        "ns.t", schema=SCHEMA, partition_spec=spec, properties={"format-version": str(version)}
    )


def _rows(values: dict[int, Row], day: int = 0) -> pa.Table:
    ids = sorted(values)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([values[i][0] for i in ids], pa.string()),
            "v": pa.array([values[i][1] for i in ids], pa.int64()),
            "ts": pa.array(
                [DAY0 + timedelta(days=day + values[i][1] % 3) for i in ids], pa.timestamp("us", "UTC")
            ),
        },
        schema=ARROW,
    )


def _change(
    table: Table, upserts: dict[int, Row] | None = None, deletes: Iterable[int] = ()
) -> row_delta.ChangeSet:
    """A change set as a worker writes it: one data file set for the rows, the deleted keys apart."""
    files = datafiles.write_data_files(table, _rows(upserts)) if upserts else []
    return row_delta.ChangeSet(
        data_files=files, deleted_keys=pa.table({"id": pa.array(sorted(deletes), pa.int64())})
    )


def _commit(
    table: Table, changes: Sequence[row_delta.ChangeSet], key: Sequence[str] = KEY
) -> row_delta.Resolution:
    return commit_round(table, key, changes, {"test.round": "x"})


def _state(table: Table) -> dict[int, Row]:
    """The table's rows as key -> (region, v); a key twice fails: a change must never leave two rows."""
    rows = table.refresh().scan().to_arrow().to_pylist()
    state = {r["id"]: (r["region"], r["v"]) for r in rows}
    assert len(state) == len(rows), f"a key has two live rows: {sorted(r['id'] for r in rows)}"
    return state


def _counts(resolution: row_delta.Resolution) -> tuple[int, int, int]:
    return resolution.inserted, resolution.updated, resolution.deleted


def test_upsert_into_an_empty_table_inserts_and_writes_no_deletes(lake: SqlCatalog) -> None:
    table = _create(lake)
    resolution = _commit(table, [_change(table, {1: ("eu", 1), 2: ("us", 2)})])
    assert _counts(resolution) == (2, 0, 0)
    assert resolution.delete_files == []
    assert _state(table) == {1: ("eu", 1), 2: ("us", 2)}
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "append"


def test_updates_and_deletes_are_position_deletes_in_the_same_snapshot(lake: SqlCatalog) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {k: ("eu", k) for k in range(1, 6)})])
    resolution = _commit(table, [_change(table, {2: ("eu", 20), 3: ("us", 30)}, deletes=[4])])
    assert _counts(resolution) == (0, 2, 1)
    assert _state(table) == {1: ("eu", 1), 2: ("eu", 20), 3: ("us", 30), 5: ("eu", 5)}

    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary
    assert summary.operation.value == "overwrite"
    assert summary["added-data-files"] == "1"
    assert summary["added-delete-files"] == "1"
    assert summary["added-position-delete-files"] == "1"
    assert summary["added-position-deletes"] == "3"
    assert summary["total-position-deletes"] == "3"
    assert summary["test.round"] == "x"
    manifests = snapshot.manifests(table.io)
    deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
    assert len(deletes) == 1 and deletes[0].added_snapshot_id == snapshot.snapshot_id
    (delete_file,) = resolution.delete_files
    assert delete_file.content == DataFileContent.POSITION_DELETES
    # The file's rows are sorted by path then position and bounded so readers can match them.
    written = pa.parquet.read_table(delete_file.file_path.removeprefix("file://"))
    assert written.column_names == ["file_path", "pos"]
    assert written["pos"].to_pylist() == sorted(written["pos"].to_pylist())
    assert [f.metadata[b"PARQUET:field_id"] for f in written.schema] == [b"2147483546", b"2147483545"]
    # All three rows are in the one data file of the first round: equal path bounds make the delete
    # file scoped to it for readers (PyIceberg's delete index, Java's referencedDataFile).
    (hit,) = set(written["file_path"].to_pylist())
    assert delete_file.lower_bounds[2147483546] == delete_file.upper_bounds[2147483546] == hit.encode()


def test_a_delete_of_an_absent_key_is_a_no_op_and_an_update_of_one_inserts(lake: SqlCatalog) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {1: ("eu", 1)})])
    resolution = _commit(table, [_change(table, {7: ("eu", 7)}, deletes=[9])])
    assert _counts(resolution) == (1, 0, 0)
    assert resolution.delete_files == []
    assert _state(table) == {1: ("eu", 1), 7: ("eu", 7)}


def test_the_later_change_set_wins_and_the_earlier_files_row_is_deleted_in_the_same_snapshot(
    lake: SqlCatalog,
) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {1: ("eu", 1), 2: ("eu", 2)})])
    first = _change(table, {1: ("eu", 10), 3: ("eu", 30), 4: ("eu", 40)})
    second = _change(table, {1: ("eu", 11)}, deletes=[3, 2])
    resolution = _commit(table, [first, second])
    # 1: updated (its live row and first's row deleted); 2: deleted; 3: inserted by first then
    # deleted by second (nothing live to delete, first's row deleted); 4: inserted.
    assert _counts(resolution) == (1, 1, 1)
    assert resolution.position_deletes == 4
    assert _state(table) == {1: ("eu", 11), 4: ("eu", 40)}
    snapshot = table.current_snapshot()
    assert snapshot is not None and len(table.snapshots()) == 2


@pytest.mark.parametrize("partitioned_by", ["region", "day"])
def test_a_row_moving_partition_leaves_no_old_copy(lake: SqlCatalog, partitioned_by: str) -> None:
    table = _create(lake, partitioned_by)
    _commit(table, [_change(table, {1: ("eu", 0), 2: ("eu", 0), 3: ("us", 1)})])
    # Key 1 moves to another region and (v % 3 -> day) another day; key 3 is deleted from "us".
    resolution = _commit(table, [_change(table, {1: ("us", 2)}, deletes=[3])])
    assert _counts(resolution) == (0, 1, 1)
    assert _state(table) == {1: ("us", 2), 2: ("eu", 0)}
    # The delete files carry the partition of the data files they point at.
    delete_partitions = {d.partition[0] for d in resolution.delete_files}
    if partitioned_by == "region":
        assert delete_partitions == {"eu", "us"}
    else:
        assert len(delete_partitions) == 2


def test_a_composite_key_matches_all_its_columns(lake: SqlCatalog) -> None:
    schema = Schema(
        NestedField(1, "tenant", StringType(), required=True),
        NestedField(2, "id", LongType(), required=True),
        NestedField(3, "v", LongType(), required=False),
        identifier_field_ids=[1, 2],
    )
    table = lake.create_table("ns.c", schema=schema, properties={"format-version": "2"})
    arrow = schema.as_arrow()

    def change(rows: list[tuple[str, int, int]], deletes: list[tuple[str, int]] = ()) -> row_delta.ChangeSet:  # type: ignore[assignment]
        data = pa.Table.from_pylist([{"tenant": t, "id": i, "v": v} for t, i, v in rows], schema=arrow)
        keys = pa.table(
            {
                "tenant": pa.array([t for t, _ in deletes], pa.string()),
                "id": pa.array([i for _, i in deletes], pa.int64()),
            }
        )
        return row_delta.ChangeSet(data_files=datafiles.write_data_files(table, data), deleted_keys=keys)

    key = ["tenant", "id"]
    _commit(table, [change([("a", 1, 1), ("a", 2, 2), ("b", 1, 3), ("b", 2, 4)])], key)
    resolution = _commit(table, [change([("a", 2, 20), ("c", 1, 5)], deletes=[("b", 1), ("c", 2)])], key)
    assert _counts(resolution) == (1, 1, 1)
    rows = table.refresh().scan().to_arrow().to_pylist()
    assert sorted((r["tenant"], r["id"], r["v"]) for r in rows) == [
        ("a", 1, 1),
        ("a", 2, 20),
        ("b", 2, 4),
        ("c", 1, 5),
    ]


def test_positions_already_deleted_are_not_deleted_twice(lake: SqlCatalog) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {1: ("eu", 1), 2: ("eu", 2), 3: ("eu", 3)})])
    assert _counts(_commit(table, [_change(table, {2: ("eu", 20)}, deletes=[1])])) == (0, 1, 1)
    # Key 1's row and key 2's first row are deleted already: only key 2's second row and key 3 remain.
    again = _commit(table, [_change(table, {2: ("eu", 21)}, deletes=[1, 3])])
    assert _counts(again) == (0, 1, 1)
    assert again.position_deletes == 2
    assert _state(table) == {2: ("eu", 21)}
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["added-position-deletes"] == "2"
    assert snapshot.summary["total-position-deletes"] == "4"
    # Deleting what is already gone writes nothing.
    gone = _commit(table, [_change(table, deletes=[1, 3])])
    assert _counts(gone) == (0, 0, 0) and gone.delete_files == []


def test_a_key_twice_in_one_change_set_is_refused(lake: SqlCatalog) -> None:
    table = _create(lake)
    change = _change(table, {1: ("eu", 1)}, deletes=[1])
    with pytest.raises(TableError, match="appear twice in one change set"):
        row_delta.resolve(table, KEY, [change])


def test_a_v1_table_is_refused_with_the_upgrade_to_make(lake: SqlCatalog) -> None:
    table = _create(lake, version=1)
    with pytest.raises(TableError, match="format-version=2"):
        row_delta.resolve(table, KEY, [_change(table, deletes=[1])])


def test_a_v3_table_is_refused_saying_pyiceberg_cannot_write_it(lake: SqlCatalog) -> None:
    # PyIceberg 0.12 cannot even create a v3 table: the check reads only the format version.
    table = _create(lake)
    v3 = Table(
        table.name(),
        metadata=table.metadata.model_copy(update={"format_version": 3}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=lake,
    )
    with pytest.raises(TableError, match=r"PyIceberg 0\.12 cannot write v3"):
        row_delta.resolve(v3, KEY, [_change(table, deletes=[1])])


def test_a_commit_in_between_fails_the_row_delta_and_resolving_again_gives_the_right_rows(
    lake: SqlCatalog,
) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {k: ("eu", k) for k in range(1, 5)})])
    _commit(table, [_change(table, {5: ("eu", 5)}, deletes=[4])])
    stale = lake.load_table("ns.t")
    changes = [_change(stale, {1: ("eu", 10)}, deletes=[2])]
    resolution = row_delta.resolve(stale, KEY, changes)

    # A compaction between resolution and commit: every file rewritten, the positions move.
    compacted = lake.load_table("ns.t")
    live = compacted.scan().to_arrow().sort_by([("id", "descending")])
    compacted.overwrite(live)

    # PyIceberg's own retry (on by default in this transaction) must not rebase the resolved deletes.
    with pytest.raises(CommitFailedException):
        staged(stale, changes, resolution).commit_transaction()
    assert _state(compacted) == {1: ("eu", 1), 2: ("eu", 2), 3: ("eu", 3), 5: ("eu", 5)}

    reloaded = lake.load_table("ns.t")
    assert _counts(_commit(reloaded, changes)) == (0, 1, 1)
    assert _state(reloaded) == {1: ("eu", 10), 3: ("eu", 3), 5: ("eu", 5)}


def test_resolution_reads_only_files_whose_key_bounds_may_hold_a_key(
    lake: SqlCatalog, read: list[str]
) -> None:
    table = _create(lake)
    for start in (0, 100, 150, 200):
        _commit(table, [_change(table, {k: ("eu", k) for k in range(start, start + 10)})])
    read.clear()
    change = _change(table, {105: ("eu", 1)}, deletes=[203])
    resolution = _commit(table, [change])
    assert _counts(resolution) == (0, 1, 1)
    # The new file and the two old files holding 105 and 203; not 0-9 (outside the keys' range,
    # pruned by planning) nor 150-159 (inside it, but no key falls in its bounds).
    assert len(read) == 3
    assert len(set(read)) == 3


Op = tuple[int, int | None, str]
"""(key, value or None for a delete, region) of one change."""


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    partitioned_by=st.sampled_from([None, "region", "day"]),
    rounds=st.lists(
        st.lists(
            st.lists(
                st.tuples(
                    st.integers(0, 12),
                    st.one_of(st.none(), st.integers(0, 99)),
                    st.sampled_from(["eu", "us"]),
                ),
                max_size=8,
            ),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=4,
    ),
    compactions=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_random_change_streams_end_as_the_model_says(
    partitioned_by: str | None, rounds: list[list[list[Op]]], compactions: list[bool]
) -> None:
    """Rounds of change sets (each a slice: last change per key kept) committed one after the other,
    some after a compaction that rewrote every file (positions move, deletes folded): the table
    equals a dict replaying every change in order, and the counts say what happened."""
    with tempfile.TemporaryDirectory() as folder:
        table = _create(_catalog(Path(folder)), partitioned_by)
        model: dict[int, Row] = {}
        for round_, compact in zip(rounds, compactions, strict=False):
            if compact and model:
                table.overwrite(table.scan().to_arrow().sort_by([("id", "descending")]))
            before = dict(model)
            changes = []
            final: dict[int, Row | None] = {}
            for slice_ in round_:
                last: dict[int, Row | None] = {}
                for key, value, region in slice_:
                    last[key] = None if value is None else (region, value)
                upserts = {k: v for k, v in last.items() if v is not None}
                changes.append(_change(table, upserts, deletes=[k for k, v in last.items() if v is None]))
                final.update(last)
            for key, row in final.items():
                if row is None:
                    model.pop(key, None)
                else:
                    model[key] = row
            resolution = _commit(table, changes)
            assert _counts(resolution) == (
                sum(1 for k, r in final.items() if r is not None and k not in before),
                sum(1 for k, r in final.items() if r is not None and k in before),
                sum(1 for k, r in final.items() if r is None and k in before),
            )
            assert _state(table) == model


KEY_TYPES: dict[str, tuple[PrimitiveType, pa.DataType, list[Any]]] = {
    # Strings longer than the 16 characters PyIceberg keeps in bounds: truncated lower and upper.
    "string": (StringType(), pa.string(), [f"customer-{'x' * 20}-{i:04d}" for i in range(30)]),
    "date": (DateType(), pa.date32(), [date(2026, 1, 1) + timedelta(days=3 * i) for i in range(30)]),
    "timestamptz": (
        TimestamptzType(),
        pa.timestamp("us", "UTC"),
        [DAY0 + timedelta(hours=7 * i) for i in range(30)],
    ),
    "decimal": (DecimalType(12, 2), pa.decimal128(12, 2), [Decimal(i) / 4 for i in range(30)]),
}


@pytest.mark.parametrize("kind", sorted(KEY_TYPES))
def test_key_bound_pruning_never_skips_a_file_holding_the_key(
    lake: SqlCatalog, kind: str, read: list[str]
) -> None:
    iceberg_type, arrow_type, keys = KEY_TYPES[kind]
    schema = Schema(
        NestedField(1, "k", iceberg_type, required=True),
        NestedField(2, "v", LongType(), required=False),
        identifier_field_ids=[1],
    )
    table = lake.create_table("ns.k", schema=schema, properties={"format-version": "2"})
    arrow = schema.as_arrow()

    def change(values: dict[int, int], deletes: Sequence[int] = ()) -> row_delta.ChangeSet:
        rows = pa.table(
            {
                "k": pa.array([keys[i] for i in values], arrow_type),
                "v": pa.array(list(values.values()), pa.int64()),
            },
            schema=arrow,
        )
        return row_delta.ChangeSet(
            data_files=datafiles.write_data_files(table, rows) if values else [],
            deleted_keys=pa.table({"k": pa.array([keys[i] for i in deletes], arrow_type)}),
        )

    for start in range(0, 30, 10):  # three files of ten keys each, disjoint bounds
        commit_round(table, ["k"], [change({i: 0 for i in range(start, start + 10)})])
    read.clear()
    resolution = commit_round(table, ["k"], [change({0: 1, 29: 1}, deletes=[9])])
    assert _counts(resolution) == (0, 2, 1)
    rows = table.refresh().scan().to_arrow()
    assert rows.num_rows == 29
    assert sorted(rows.filter(pc.equal(rows["v"], 1))["k"].to_pylist()) == sorted([keys[0], keys[29]])
    # The new file, and the old ones whose bounds may hold a key: the middle file (keys 10-19) is
    # skipped by its bounds, except for strings whose 16-character bounds all read "customer-xxxxxxx".
    assert len(read) == (4 if kind == "string" else 3)


def test_a_table_with_equality_deletes_is_refused_with_how_to_fold_them(lake: SqlCatalog) -> None:
    table = _create(lake)
    _commit(table, [_change(table, {1: ("eu", 1)})])
    # Another engine's equality-delete file (RowDelta itself only takes position deletes).
    equality = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=f"{table.location()}/data/foreign-eq-deletes.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=1,
        equality_ids=[1],
    )
    equality.spec_id = 0
    txn = table.transaction()
    with snapshots.RowDelta(txn, table.io, {}) as delta:
        delta._added_delete_files.append(equality)
    txn.commit_transaction()
    with pytest.raises(TableError, match=r"(?s)equality-delete files.*rewrite_data_files"):
        row_delta.resolve(table, KEY, [_change(table, {1: ("eu", 2)})])


def test_deletes_of_rows_under_an_older_partition_spec_carry_that_spec(lake: SqlCatalog) -> None:
    table = _create(lake, "region")
    _commit(table, [_change(table, {1: ("eu", 1), 2: ("us", 2)})])
    with table.update_spec() as update:
        update.remove_field("region")
        update.add_field("ts", DayTransform(), "ts_day")
    table = lake.load_table("ns.t")
    resolution = _commit(table, [_change(table, {1: ("us", 10), 3: ("eu", 3)}, deletes=[2])])
    assert _counts(resolution) == (1, 1, 1)
    # Both deleted rows live in files of the first spec: their delete files say so, per partition.
    assert sorted((d.spec_id, d.partition[0]) for d in resolution.delete_files) == [(0, "eu"), (0, "us")]
    assert _state(table) == {1: ("us", 10), 3: ("eu", 3)}
    snapshot = table.current_snapshot()
    assert snapshot is not None
    delete_manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES]
    assert [m.partition_spec_id for m in delete_manifests] == [0]
