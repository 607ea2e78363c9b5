"""Resolve + commit time of a change round (``row_delta``) by table size: figures, not assertions.

    PYTHONPATH=. .venv/bin/python tests/support/bench_row_delta.py [ROWS ...] [--changes N] [--rounds R]

Run from the repository root. Per table size: a v2 table (SQL catalog in a temporary folder) is
loaded with ROWS rows in files of 50k (as rounds of the sink leave them), then R rounds of N
changes each (70 % updates and 10 % deletes of random live keys, 20 % inserts of new keys, in two
change sets as two slices of a round) are resolved and committed. Printed per round: resolve and
commit seconds, files read, delete files and position deletes written, then the full-scan time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.row_deltas import staged

from fanout_sink.protocol import datafiles, row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "v", LongType(), required=False),
    NestedField(3, "payload", StringType(), required=False),
    identifier_field_ids=[1],
)
FILE_ROWS = 50_000


def _rows(keys: np.ndarray, value: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "v": pa.array(np.full(len(keys), value, dtype=np.int64)),
            "payload": pa.array(np.char.add("row-", keys.astype(str)).astype(object), pa.string()),
        },
        schema=SCHEMA.as_arrow(),
    )


def _commit(table: Table, changes: list[row_delta.ChangeSet]) -> tuple[row_delta.Resolution, float, float]:
    started = time.perf_counter()
    resolution = row_delta.resolve(table, ["id"], changes)
    resolved = time.perf_counter()
    staged(table, changes, resolution).commit_transaction()
    return resolution, resolved - started, time.perf_counter() - resolved


def run(size: int, changes: int, rounds: int, folder: Path) -> None:
    catalog = SqlCatalog("bench", uri=f"sqlite:///{folder / 'c.db'}", warehouse=f"file://{folder / 'w'}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=SCHEMA, properties={"format-version": "2"})
    started = time.perf_counter()
    for start in range(0, size, FILE_ROWS):
        keys = np.arange(start, min(size, start + FILE_ROWS), dtype=np.int64)
        table = catalog.load_table("ns.t")
        _commit(
            table,
            [row_delta.ChangeSet(datafiles.write_data_files(table, _rows(keys, 0)), pa.table({"id": []}))],
        )
    print(
        f"table of {size:,} rows loaded in {time.perf_counter() - started:.1f} s "
        f"({-(-size // FILE_ROWS)} files)"
    )
    random = np.random.default_rng(7)
    live = np.arange(size, dtype=np.int64)
    next_key = size
    for round_no in range(1, rounds + 1):
        table = catalog.load_table("ns.t")
        picked = random.choice(live, size=int(changes * 0.8), replace=False)
        updates, deletes = picked[: int(changes * 0.7)], picked[int(changes * 0.7) :]
        inserts = np.arange(next_key, next_key + changes - len(picked), dtype=np.int64)
        next_key += len(inserts)
        upserts = np.concatenate([updates, inserts])
        random.shuffle(upserts)
        half, deletes_half = len(upserts) // 2, len(deletes) // 2
        sets = [
            row_delta.ChangeSet(
                datafiles.write_data_files(table, _rows(np.sort(part), round_no)),
                pa.table({"id": pa.array(dels, pa.int64())}),
            )
            for part, dels in (
                (upserts[:half], deletes[:deletes_half]),
                (upserts[half:], deletes[deletes_half:]),
            )
        ]
        resolution, resolve_s, commit_s = _commit(table, sets)
        live = np.setdiff1d(np.concatenate([live, inserts]), deletes)
        print(
            f"  round {round_no}: {changes:,} changes: resolve {resolve_s:.2f} s, commit {commit_s:.2f} s; "
            f"inserted {resolution.inserted:,} updated {resolution.updated:,} "
            f"deleted {resolution.deleted:,}; "
            f"{len(resolution.delete_files)} delete file(s), {resolution.position_deletes:,} position deletes"
        )
    table = catalog.load_table("ns.t")
    started = time.perf_counter()
    scanned = table.scan().to_arrow()
    assert scanned.num_rows == len(live), (scanned.num_rows, len(live))
    print(
        f"  PyIceberg full scan: {time.perf_counter() - started:.2f} s, {scanned.num_rows:,} rows (= model)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000, 1_000_000])
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            run(size, args.changes, args.rounds, Path(folder))


if __name__ == "__main__":
    main()
