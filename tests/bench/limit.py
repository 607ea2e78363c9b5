"""The in-process limit: the sink's own decode + route + convert + Parquet write, no Kafka, no Spark.

One process per partition, as Spark would run one task per partition, each feeding its share of
the records through ``build_processor`` and ``protocol.datafiles`` in slices of the offsets cap.
The records file is first split (untimed) into one file per partition; a worker then loads its file
(untimed) as raw slices, built in Arrow without a Python object per record, as the native reader
hands a task its records: the limit is the processing alone, reading Kafka is the sink's own cost
(a worker holds its half of the records: about 1.1 GB at 10M). The timed span runs from the first
worker's start to the last one's end, after both built their processor and loaded their slices
(CLOCK_MONOTONIC is one clock for every process). Afterwards, untimed, the files are appended to
the tables so the equality check covers this path too.
``run`` starts this module as a child and measures its process tree like every other system.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import yaml

from bench.context import PARTITIONS, RunContext, SystemRun
from bench.landed import landed
from bench.ours import sink_config
from bench.proctree import run_child
from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.kafka.consumed import RAW_RECORD_SCHEMA
from fanout_sink.protocol import datafiles
from fanout_sink.transform.processor import build_processor

SYSTEM = "in-process limit"
DEFAULT_BATCH = 400_000
"""Records the limit's two processes take per slice pair when the sink's batch size is unset: the
limit reads a file, so this only sets how much each ``process`` call holds."""
_WORK_LINE = "in-process work seconds: "
_EPOCH_US = 1_714_521_600_000_000
"""2024-05-01T00:00:00Z in µs: the records' timestamps, one ms apart (as ``support.raw_slices``)."""


def _raw_slices(path: Path, partition: int, size: int) -> Iterator[pa.Table]:
    """The lines of ``path`` as raw slices (``RAW_RECORD_SCHEMA``) of ``size`` records, offsets
    counted from 0, built without a Python object per record: Arrow's CSV reader splits the lines
    (no delimiter, quote or escape occurs in them), every other column is made whole-array. The
    sink's own worker gets its slices from the native reader the same way, so the limit must not
    pay per-record Python costs the sink no longer pays."""
    values = pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(column_names=["value"], block_size=8 << 20),
        parse_options=pcsv.ParseOptions(delimiter="\x1f", quote_char=False, escape_char=False),
        convert_options=pcsv.ConvertOptions(column_types={"value": pa.binary()}),
    ).column("value")
    for offset in range(0, len(values), size):
        yield _raw(values.slice(offset, size).combine_chunks(), partition, offset)


def _raw(values: pa.Array, partition: int, offset: int) -> pa.Table:
    n = len(values)
    offsets = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), offset - 1)
    micros = pc.add(pc.multiply(offsets, 1000), _EPOCH_US)
    columns = {
        "key": pa.nulls(n, pa.binary()),
        "value": values,
        "topic": pa.repeat(pa.scalar("bench", pa.string()), n),
        "partition": pa.repeat(pa.scalar(partition, pa.int32()), n),
        "offset": offsets,
        "timestamp": micros.cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.repeat(pa.scalar(0, pa.int32()), n),
        "headers": pa.nulls(n, RAW_RECORD_SCHEMA.field("headers").type),
    }
    return pa.table(columns, schema=RAW_RECORD_SCHEMA)


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
    # Untimed: the records, already in Arrow as the native reader hands them to a task (reading Kafka
    # is the sink's cost alone: the limit is the processing's).
    slices = list(_raw_slices(values_path, partition, slice_size))
    # Untimed warm-up, as a long-running task has had: tables loaded, expressions compiled, writer
    # ready. Its files are never appended.
    for table_rows in process(slices[0].slice(0, 1000)).tables.values():
        datafiles.write_data_files(table_rows.table, table_rows.rows.slice(0, 1))
    ready.wait()
    started = time.monotonic()
    for raw in slices:
        for name, table_rows in process(raw).tables.items():
            files.setdefault(name, []).extend(datafiles.write_data_files(table_rows.table, table_rows.rows))
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
