"""A change table's round: its changes resolved into Iceberg v2 position deletes, committed with
the new rows in one snapshot (invariant I7).

Why position deletes, resolved when the table is committed: the rows a change replaces are known
only then (workers run in parallel, long before), and position deletes are the one row-level delete
both PyIceberg 0.12 and Spark read (PyIceberg refuses equality deletes). Unlike equality deletes they
apply to data files of the same sequence number, so a delete may point at a row committed in the
same snapshot: a key changed twice in one round leaves one row.

``resolve`` reads one snapshot of the table; the commit's ``pyiceberg_internals.snapshots.RowDelta`` asserts
that snapshot is still the branch head (and refuses PyIceberg's rebasing retry), so a compaction or
another writer in between fails the commit and the caller resolves again. A delete can never point
at a file a rewrite removed, nor miss a row a rewrite moved.

Which live rows hold a mentioned key is :mod:`.key_lookup`'s (pruned by planning and per-file key
bounds); here, per key, the last change wins. Everything per row is Arrow (joins, sorts); Python
loops run per file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from fanout_sink.errors import TableError
from fanout_sink.protocol import key_lookup, position_deletes
from fanout_sink.protocol.key_lookup import FILE, POS

_SEQ, _DELETE = "_seq", "_delete"
"""Resolution's working columns beside the key columns (and key_lookup's ``FILE``, ``POS``); a key
column of these names is refused."""


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


def _with(rows: pa.Table, name: str, value: int | bool) -> pa.Table:
    """``rows`` with a constant column (built in numpy, not per row)."""
    array = np.full(rows.num_rows, value, dtype=np.bool_ if isinstance(value, bool) else np.int64)
    return rows.append_column(name, pa.array(array))


def resolve(table: Table, key: Sequence[str], changes: Sequence[ChangeSet]) -> Resolution:
    """The position deletes that make ``changes`` (in commit order, older first) the keys' last
    state in ``table``: per key, the last change set mentioning it wins; every other copy (a live
    row of the table's current snapshot, or a row of an earlier change set) is deleted. Writes the
    delete files; commits nothing."""
    columns = key_lookup.key_columns(table, key, working=(_SEQ, _DELETE))
    names, types = columns.names, columns.types
    files: list[DataFile] = []
    rows, deletes = [], []
    for seq, change in enumerate(changes):
        for data_file in change.data_files:
            keys = key_lookup.read_keys(table.io, data_file.file_path, columns, len(files))
            rows.append(_with(keys, _SEQ, seq))
            files.append(data_file)
        if change.deleted_keys.num_rows:
            deletes.append(_with(change.deleted_keys.select(names).cast(types), _SEQ, seq))
    new_rows = pa.concat_tables(rows) if rows else _with(key_lookup.no_rows(columns), _SEQ, 0)
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

    live = key_lookup.live_rows(table, last.select(names), columns, files)
    superseded = new_rows.join(last.rename_columns([*names, "_last"]), keys=names, join_type="inner")
    superseded = superseded.filter(pc.less(superseded[_SEQ], superseded["_last"]))
    targets = pa.concat_tables([live.select([FILE, POS]), superseded.select([FILE, POS])])

    live_keys = live.select(names).group_by(names).aggregate([])
    upserts = winners.filter(pc.invert(winners[_DELETE])).select(names)
    updated = upserts.join(live_keys, keys=names, join_type="left semi").num_rows
    dropped = winners.filter(winners[_DELETE]).select(names)
    return Resolution(
        delete_files=position_deletes.write(
            table, files, targets[FILE].combine_chunks(), targets[POS].combine_chunks()
        ),
        inserted=upserts.num_rows - updated,
        updated=updated,
        deleted=live.select(names).join(dropped, keys=names, join_type="left semi").num_rows,
        position_deletes=targets.num_rows,
    )
