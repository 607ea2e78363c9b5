"""What a round's table commits cost, without a broker: N tables, one small data file each per round.

``PYTHONPATH=tests .venv/bin/python -m bench.table_commits --tables 300 --rounds 4 [--threads 4]``

The tables live in a fresh SQLite SQL catalog with a local warehouse (``DurableFileIO``, as the
app has it). Each round first writes one data file of ``--rows`` rows per table (the workers' part,
not measured), then hands every table's ``DataWritten`` to ``commit_runners.commit_in_threads`` with
one ``TableCommitter``: the path of the driver's commit threads and of each executor task's share.
Per round it prints the tables committed per second and the process's CPU milliseconds per table.
The first round is reported apart (the catalog's connections and the layouts are built there).
``--round-pause S`` sleeps around each round's commits, so that a profiler's samples of the commits
can be told from the files' writes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from bench.context import catalog_settings
from fanout_sink.catalog import load_catalog
from fanout_sink.protocol import datafiles
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.commit_runners import RoundTables, commit_in_threads
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.table_commit import TableCommitter

NAMESPACE = "commits"
SINK = "bench"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False), NestedField(2, "note", StringType(), required=False)
)


@dataclass(frozen=True)
class RoundFigures:
    round: int
    tables: int
    wall_s: float
    tables_per_s: float
    cpu_ms_per_table: float


def _rows(first: int, count: int) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "note": pa.array([f"n{i}" for i in ids], pa.string())})


def run(
    tables: int, rounds: int, threads: int, rows: int, folder: Path, pause_s: float
) -> list[RoundFigures]:
    catalog = load_catalog(catalog_settings(folder))
    catalog.create_namespace_if_not_exists(NAMESPACE)
    names = [f"{NAMESPACE}.t{t:05d}" for t in range(tables)]
    loaded = {name: catalog.create_table(name, schema=SCHEMA) for name in names}
    committer = TableCommitter(SINK, catalog)
    offset, figures = 0, []
    for number in range(1, rounds + 1):
        due: dict[str, list[PendingFiles]] = {}
        for name in names:  # the workers' part: one file per table
            table = loaded[name]
            records = tuple(
                datafiles.to_record(f, table) for f in datafiles.write_data_files(table, _rows(offset, rows))
            )
            ref = ev.TableRef(
                namespace=(NAMESPACE,), name=name.split(".")[1], uuid=str(table.metadata.table_uuid)
            )
            event = ev.DataWritten(table=ref, files=records, topic="src", partition=0, next_offset=offset + 1)
            due[name] = [PendingFiles(offset, event)]
            offset += 1
        if pause_s:
            time.sleep(pause_s)
        round_tables = RoundTables(due, offset, str(uuid.uuid4()), None, deadline=time.monotonic() + 3600)
        started, cpu = time.perf_counter(), time.process_time()
        outcomes = commit_in_threads(committer, round_tables, threads)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        failed = {t: c.error for t, c in outcomes.items() if c.outcome != "committed"}
        if failed:
            raise RuntimeError(
                f"round {number}: {len(failed)} table(s) not committed, e.g. {next(iter(failed.items()))}"
            )
        figures.append(
            RoundFigures(
                number, tables, round(wall_s, 3), round(tables / wall_s, 1), round(cpu_s * 1000 / tables, 2)
            )
        )
        print(
            f"round {number}: {tables} tables in {wall_s:.2f} s, {tables / wall_s:.0f} tables/s, "
            f"{cpu_s * 1000 / tables:.1f} ms CPU per table (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        if pause_s:
            time.sleep(pause_s)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="commit threads (an executor task has 4)")
    parser.add_argument("--rows", type=int, default=20, help="rows per table and round")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument(
        "--round-pause", type=float, default=0.0, help="seconds of sleep around each round's commits"
    )
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the figures")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="table-commits-") as scratch:
        figures = run(
            args.tables,
            args.rounds,
            args.threads,
            args.rows,
            args.work_dir or Path(scratch),
            args.round_pause,
        )
    steady = figures[1:] or figures
    print(
        f"steady rounds: median {statistics.median(f.tables_per_s for f in steady):.0f} tables/s, "
        f"{statistics.median(f.cpu_ms_per_table for f in steady):.1f} ms CPU per table"
    )
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
