"""What a system landed: visible row counts while it runs, then ids, data files and snapshots per table.

``visible_rows`` is polled while a system runs, so it must cost the measured system nothing: it
reads the SQL catalog's table pointers with one query and opens a table's metadata JSON only when
its pointer moved (the warehouse is local). The ids of every table are compared across systems
after each run: a benchmark whose systems landed different rows compares nothing.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.errors import FanoutSinkError


class LandedRowsMismatchError(FanoutSinkError):
    """Two systems landed different rows in the same table: the comparison would be meaningless."""


@dataclass
class VisibleRows:
    """Rows visible per table in one SQLite SQL catalog (PyIceberg's and Iceberg's JdbcCatalog V1)."""

    database: Path
    catalog_name: str
    _seen: dict[str, tuple[str, int]] = field(default_factory=dict)

    def __call__(self) -> dict[str, int]:
        with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=5) as db:
            pointers = db.execute(
                "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables "
                "WHERE catalog_name = ?",
                (self.catalog_name,),
            ).fetchall()
        for namespace, name, location in pointers:
            key = f"{namespace}.{name}"
            if location and self._seen.get(key, ("", 0))[0] != location:
                self._seen[key] = (location, _total_records(location))
        return {key: rows for key, (_, rows) in self._seen.items()}

    def total(self) -> int:
        try:
            return sum(self().values())
        except sqlite3.OperationalError:  # the catalog is being written or not created yet
            return 0


def _total_records(metadata_location: str) -> int:
    metadata = json.loads(Path(urlparse(metadata_location).path).read_text())
    current = metadata.get("current-snapshot-id")
    for snapshot in metadata.get("snapshots", []):
        if snapshot["snapshot-id"] == current:
            return int(snapshot.get("summary", {}).get("total-records", 0))
    return 0


@dataclass(frozen=True)
class TableLanding:
    """One table after a run: its sorted ids, data files in the current snapshot, snapshots."""

    ids: pa.Array
    data_files: int
    snapshots: int
    commit_times_ms: tuple[int, ...] = ()
    """Every snapshot's timestamp, oldest first: how fresh the table stayed while a backlog drained."""


def sorted_ids(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One comparable form for ids from any reader: one chunk, ``large_string``, sorted."""
    flat = pc.cast(ids, pa.large_string())
    flat = flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat
    return pc.take(flat, pc.sort_indices(flat))


def landed(catalog: Any, tables: list[str]) -> dict[str, TableLanding]:
    out = {}
    for name in tables:
        table = catalog.load_table(name)
        out[name] = TableLanding(
            ids=sorted_ids(table.scan(selected_fields=("id",)).to_arrow()["id"]),
            data_files=sum(1 for _ in table.scan().plan_files()),
            snapshots=len(table.snapshots()),
            commit_times_ms=tuple(sorted(s.timestamp_ms for s in table.snapshots())),
        )
    return out


def commit_gaps(tables: dict[str, TableLanding], started_ms: int) -> tuple[float | None, float | None]:
    """(seconds from ``started_ms`` to the first table commit, the longest any table went between two
    of its commits) over ``tables``; None where no table committed (twice)."""
    firsts = [t.commit_times_ms[0] for t in tables.values() if t.commit_times_ms]
    gaps = [
        later - earlier
        for t in tables.values()
        for earlier, later in zip(t.commit_times_ms, t.commit_times_ms[1:], strict=False)
    ]
    return (
        (min(firsts) - started_ms) / 1000 if firsts else None,
        max(gaps) / 1000 if gaps else None,
    )


def check_same_rows(
    reference: tuple[str, dict[str, TableLanding]], other: tuple[str, dict[str, TableLanding]]
) -> None:
    """Raise :class:`LandedRowsMismatchError` naming the system and table whose ids differ."""
    ref_name, ref = reference
    name, tables = other
    for table, expected in ref.items():
        got = tables.get(table)
        if got is None:
            raise LandedRowsMismatchError(f"{name}: table {table} is missing  fix: read its log")
        if not got.ids.equals(expected.ids):
            missing = pc.sum(pc.invert(pc.is_in(expected.ids, got.ids))).as_py()
            extra = pc.sum(pc.invert(pc.is_in(got.ids, expected.ids))).as_py()
            duplicates = len(got.ids) - len(pc.unique(got.ids))
            raise LandedRowsMismatchError(
                f"{name} landed different rows than {ref_name} in {table}: {len(got.ids):,} rows vs "
                f"{len(expected.ids):,}, {missing} of {ref_name}'s ids missing, {extra} extra, "
                f"{duplicates} duplicated  fix: read {name}'s log in the run folder"
            )
