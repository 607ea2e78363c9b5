"""The in-process limit: the sink's own decode + route + convert + Parquet write, no Kafka, no Spark.

One process per partition, as Spark would run one task per partition, each feeding its share of
the records through ``build_processor`` and ``protocol.datafiles`` in slices of the offsets cap.
The timed span runs from the first worker's start to the last one's end, after both read their
records and built their processor (CLOCK_MONOTONIC is one clock for every process). Afterwards,
untimed, the files are appended to the tables so the equality check covers this path too.
``run`` starts this module as a child and measures its process tree like every other system.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.devtools.bench.context import PARTITIONS, RunContext, SystemRun
from fanout_sink.devtools.bench.landed import landed
from fanout_sink.devtools.bench.ours import sink_config
from fanout_sink.devtools.bench.proctree import run_child
from fanout_sink.devtools.raw_slices import make_raw_slice
from fanout_sink.protocol import datafiles
from fanout_sink.transform.processor import build_processor

SYSTEM = "in-process limit"
_WORK_LINE = "in-process work seconds: "


def _worker(config_path: str, values: list[bytes], partition: int, slice_size: int, ready: Any) -> Any:
    config = parse_config(yaml.safe_load(Path(config_path).read_text()), config_path)
    catalog = load_catalog(config.catalog)
    process = build_processor(config, catalog)
    slices = [
        make_raw_slice(values[i : i + slice_size], topic="bench", partition=partition, start_offset=i)
        for i in range(0, len(values), slice_size)
    ]
    # Untimed warm-up, as a long-running task has had: tables loaded, expressions compiled, writer
    # ready. Its files are never appended.
    for table_rows in process(slices[0].slice(0, 1000)).tables.values():
        datafiles.write_data_files(table_rows.table, table_rows.rows.slice(0, 1))
    ready.wait()
    started = time.monotonic()
    files: dict[str, list[Any]] = {}
    for raw in slices:
        for name, table_rows in process(raw).tables.items():
            files.setdefault(name, []).extend(datafiles.write_data_files(table_rows.table, table_rows.rows))
    return started, time.monotonic(), files


def _job(config_path: str, values_file: Path, slice_size: int) -> None:
    values = values_file.read_bytes().splitlines()
    context = multiprocessing.get_context("fork")
    ready = context.Manager().Barrier(PARTITIONS)
    with context.Pool(PARTITIONS) as pool:
        results = pool.starmap(
            _worker,
            [(config_path, values[p::PARTITIONS], p, slice_size, ready) for p in range(PARTITIONS)],
        )
    work_s = max(r[1] for r in results) - min(r[0] for r in results)
    print(f"{_WORK_LINE}{work_s:.3f}", flush=True)
    config = parse_config(yaml.safe_load(Path(config_path).read_text()), config_path)
    catalog = load_catalog(config.catalog)
    names = {name for r in results for name in r[2]}
    for name in sorted(names):
        table = catalog.load_table(name)
        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
            for result in results:
                for data_file in result[2].get(name, []):
                    append.append_data_file(data_file)


def run(ctx: RunContext) -> SystemRun:
    catalog = ctx.prepare()
    config = ctx.folder / "sink.yaml"
    config.write_text(yaml.safe_dump(sink_config(ctx, ctx.unique_name("limit"))))
    command = [
        sys.executable, "-m", __name__, "--config", str(config), "--values", str(ctx.values_file),
        "--slice-size", str(ctx.max_offsets_per_trigger // PARTITIONS),
    ]  # fmt: skip
    log = ctx.folder / "limit.log"
    child = run_child(command, env=ctx.child_env(), log=log)
    work = [line for line in child.stderr.splitlines() if line.startswith(_WORK_LINE)]
    if child.returncode != 0 or not work:
        raise child.failure(SYSTEM, log)
    wall_s = float(work[-1][len(_WORK_LINE) :])
    return SystemRun.of_child(SYSTEM, child, landed(catalog, ctx.variant.table_names()), wall_s=wall_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--values", type=Path, required=True)
    parser.add_argument("--slice-size", type=int, default=200_000)
    args = parser.parse_args(argv)
    _job(args.config, args.values, args.slice_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
