"""The in-process limit: the sink's own decode + route + convert + Parquet write, no Kafka, no Spark.

One process per partition, as Spark would run one task per partition, each feeding its share of
the records through ``build_processor`` and ``protocol.datafiles`` in slices of the offsets cap.
The records file is first split (untimed) into one file per partition; a worker reads its file one
slice at a time, as the sink's worker reads a slice from Kafka, so 10M records are never in memory
at once (reading a slice from the page cache is inside the timed span: a few % of it). The timed
span runs from the first worker's start to the last one's end, after both built their processor
and read their first slice (CLOCK_MONOTONIC is one clock for every process). Afterwards,
untimed, the files are appended to the tables so the equality check covers this path too.
``run`` starts this module as a child and measures its process tree like every other system.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml
from support.raw_slices import make_raw_slice

from bench.context import PARTITIONS, RunContext, SystemRun
from bench.landed import landed
from bench.ours import sink_config
from bench.proctree import run_child
from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.protocol import datafiles
from fanout_sink.transform.processor import build_processor

SYSTEM = "in-process limit"
DEFAULT_BATCH = 400_000
"""Records the limit's two processes take per slice pair when the sink's batch size is unset: the
limit reads a file, so this only sets how much each ``process`` call holds."""
_WORK_LINE = "in-process work seconds: "


def _slices(values: IO[bytes], size: int) -> Iterator[list[bytes]]:
    """The lines of ``values`` (newline stripped), ``size`` at a time."""
    while chunk := [line.rstrip(b"\n") for line in itertools.islice(values, size)]:
        yield chunk


def _split(values_file: Path, folder: Path) -> list[Path]:
    """Value n of ``values_file`` into partition n % PARTITIONS's own file, streamed."""
    paths = [folder / f"{values_file.stem}.p{p}" for p in range(PARTITIONS)]
    outs = [path.open("wb") for path in paths]
    try:
        with values_file.open("rb") as values:
            for n, line in enumerate(values):
                outs[n % PARTITIONS].write(line)
    finally:
        for out in outs:
            out.close()
    return paths


def _worker(config_path: str, values_path: Path, partition: int, slice_size: int, ready: Any) -> Any:
    config = parse_config(yaml.safe_load(Path(config_path).read_text()), config_path)
    catalog = load_catalog(config.catalog)
    process = build_processor(config, catalog)
    files: dict[str, list[Any]] = {}
    with values_path.open("rb") as values:
        slices = _slices(values, slice_size)
        first = next(slices, [])
        # Untimed warm-up, as a long-running task has had: tables loaded, expressions compiled, writer
        # ready. Its files are never appended.
        warm = make_raw_slice(first[:1000], topic="bench", partition=partition)
        for table_rows in process(warm).tables.values():
            datafiles.write_data_files(table_rows.table, table_rows.rows.slice(0, 1))
        ready.wait()
        started = time.monotonic()
        offset = 0
        for chunk in itertools.chain([first], slices):
            raw = make_raw_slice(chunk, topic="bench", partition=partition, start_offset=offset)
            offset += len(chunk)
            for name, table_rows in process(raw).tables.items():
                files.setdefault(name, []).extend(
                    datafiles.write_data_files(table_rows.table, table_rows.rows)
                )
    return started, time.monotonic(), files


def _job(config_path: str, values_file: Path, slice_size: int) -> None:
    parts = _split(values_file, Path(config_path).parent)
    context = multiprocessing.get_context("fork")
    ready = context.Manager().Barrier(PARTITIONS)
    with context.Pool(PARTITIONS) as pool:
        results = pool.starmap(
            _worker, [(config_path, parts[p], p, slice_size, ready) for p in range(PARTITIONS)]
        )
    for part in parts:
        part.unlink()
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
        "--slice-size", str((ctx.max_offsets_per_trigger or DEFAULT_BATCH) // PARTITIONS),
    ]  # fmt: skip
    log = ctx.folder / "limit.log"
    child = run_child(command, env=ctx.child_env(), log=log, timeout_s=ctx.timeout_s, cpus=ctx.taskset)
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
