"""Maintenance at fan-out scale: many tables of small files, one run bounded by ``max-duration``.

    PYTHONPATH=tests python -m bench.maintenance_fanout --tables 500 --max-duration 180s

Creates ``--tables`` sink tables in a fresh SQLite catalog, in process and quickly: table ``i`` gets
``2 + (i * 7) % --max-files`` one-row appends in one catalog commit (a data file and a snapshot each,
every snapshot carrying the sink's commit properties), so the tables differ in what maintenance
gains. Then it times the ranking alone (listing the sink's tables and scoring them, no Spark), and one
``maintain_run`` as ``fanout-sink maintain --max-duration`` does, on a local Spark session with the
app's fair-scheduler pools, its jobs in the maintenance pool. Expiry keeps the last snapshot
(``max-snapshot-age: 0s``); orphan cleanup lists every table done, but the control topic is not read
(no broker: nothing is pending), which is the only stub. Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout_sink.catalog import CatalogSettings, load_catalog, spark_catalog_conf
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.maintenance import priority
from fanout_sink.maintenance.report import MaintenanceRun
from fanout_sink.protocol import group_layout, orphans, table_state
from fanout_sink.pyiceberg_internals.transactions import no_retry_transaction
from fanout_sink.spark import executor_commits
from fanout_sink.spark.maintenance import maintain_run
from fanout_sink.spark.maintenance_schedule import MaintenanceSchedule

SINK = "fanoutmaint"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("topic", pa.string())])


def create(catalog: Any, tables: int, max_files: int) -> None:
    catalog.create_namespace_if_not_exists("bench")
    for i in range(tables):
        table = catalog.create_table(f"bench.t{i:05d}", schema=SCHEMA)
        # The sink's staged transaction: PyIceberg's own applies every staged append again on each
        # access, 3x slower to create a table of 40 snapshots.
        txn = no_retry_transaction(table)
        for n in range(2 + (i * 7) % max_files):
            props = table_state.summary_properties(SINK, {0: n + 1}, f"c{n}", None)
            txn.append(pa.Table.from_pylist([{"id": n, "topic": "t"}], SCHEMA), props)
        txn.commit_transaction()


def config(settings: CatalogSettings, max_duration: str) -> SinkConfig:
    return parse_config(
        {
            "name": SINK,
            "source": {"topics": ["t"]},
            "catalog": settings.model_dump(),
            "tables": {"bench.t00000": {}},
            "maintenance": {
                "max-duration": max_duration,
                "max-snapshot-age": "0s",
                "min-snapshots-to-keep": 1,
            },
        }
    )


def report(
    args: argparse.Namespace, created_s: float, ranked_s: float, run: MaintenanceRun, cpu_s: float
) -> str:
    # Orphans are one pass over all tables done: each table's orphan step runs from the pass's start
    # to its record, so the first is the pass; a table's own time is its other steps.
    per_step: dict[str, list[float]] = defaultdict(list)
    orphan_pass = min(
        (s.duration_s for r in run.results for s in r.steps if s.name == "orphans"), default=0.0
    )
    for result in run.results:
        for step in result.steps:
            if step.action == "ran" and step.name != "orphans":
                per_step[step.name].append(step.duration_s)
    done = len(run.results)
    # Its steps' own time: a result's duration runs to the orphan cleanup of all tables.
    per_table = [sum(s.duration_s for s in r.steps if s.name != "orphans") for r in run.results]
    lines = [
        f"`{shlex.join(['PYTHONPATH=tests', 'python', '-m', 'bench.maintenance_fanout', *sys.argv[1:]])}`",
        "",
        f"- tables: {args.tables}, files each 2-{args.max_files + 1} (one snapshot each); "
        f"created in {created_s:.1f} s",
        f"- ranking (list the sink's tables + score them, no Spark): {ranked_s:.2f} s, "
        f"{ranked_s / args.tables * 1000:.2f} ms a table",
        f"- run: {run.line()}",
        f"- CPU of this process during the run: {cpu_s:.1f} s, {cpu_s / max(1, len(run.results)):.3f} s a "
        "table (the in-process steps' work: on a busy machine a better guess of a quiet run's time than "
        "the wall; Spark's JVM not counted)",
        f"- tables done per minute: {done / run.duration_s * 60:.1f}; per table median "
        f"{statistics.median(per_table):.2f} s, max {max(per_table):.2f} s (orphans apart); "
        f"orphan cleanup of the tables done, one pass: {orphan_pass:.1f} s",
        f"- the first {min(args.first, done)} tables taken (those that gain most, the same in any run of "
        f"this command): per table median {statistics.median(per_table[: args.first]):.2f} s, "
        f"total {sum(per_table[: args.first]):.1f} s (orphans apart)",
        "",
        "| step | ran on tables | median s | mean s | total s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, times in per_step.items():
        median, mean = statistics.median(times), statistics.mean(times)
        lines.append(f"| {name} | {len(times)} | {median:.2f} | {mean:.2f} | {sum(times):.1f} |")
    lines += ["", "Order taken (first 10) and the first left:", ""]
    for r, own_s in list(zip(run.results, per_table, strict=True))[:10]:
        lines.append(
            f"- {r.table}: data files {r.before.data_files} -> {r.after.data_files}, "
            f"snapshots {r.before.snapshots} -> {r.after.snapshots}, {own_s:.1f} s"
        )
    lines += [f"- left: {g.describe()}" for g in run.left[:3]]
    return "\n".join(lines)


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """The benchmark; ``spark``: a session to use (the smoke test's), else a local one of its own."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=500)
    parser.add_argument("--max-files", type=int, default=40)
    parser.add_argument("--max-duration", default="180s")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument(
        "--first", type=int, default=30, help="also report the first N tables taken (compare runs on them)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="maint-fanout-"))
    settings = CatalogSettings(
        name=f"maintbench_{uuid.uuid4().hex[:6]}",  # Spark keeps a catalog per name for its life
        type="sql",
        uri=f"sqlite:///{work / 'catalog.db'}",
        warehouse=f"file://{work / 'warehouse'}",
    )
    catalog = load_catalog(settings)
    started = time.monotonic()
    create(catalog, args.tables, args.max_files)
    created_s = time.monotonic() - started
    sink = config(settings, args.max_duration)
    started = time.monotonic()
    found = table_state.sink_tables(catalog, SINK)
    priority.rank([(t.identifier, t.table) for t in found], sink.maintenance_for)
    ranked_s = time.monotonic() - started
    own_session = spark is None
    if own_session:
        from fanout_sink.spark.session import build_spark_session

        spark = build_spark_session(
            settings,
            master=f"local[{args.cores}]",
            app_name="maintenance-fanout-bench",
            extra_conf=executor_commits.spark_conf(),
        )
    else:
        for key, value in spark_catalog_conf(settings).items():
            spark.conf.set(key, value)
    # No broker: the control topic is not read, nothing is pending (orphans are still listed).
    channel_in_use, pending_files = group_layout.channel_in_use, orphans.pending_files
    group_layout.channel_in_use = lambda _config: None  # type: ignore[assignment,return-value]
    orphans.pending_files = lambda _channel: set()  # type: ignore[assignment]
    try:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", MaintenanceSchedule.POOL)
        cpu_started = time.process_time()
        run = maintain_run(spark, sink)
        cpu_s = time.process_time() - cpu_started
    finally:
        group_layout.channel_in_use, orphans.pending_files = channel_in_use, pending_files
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
        if own_session:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(report(args, created_s, ranked_s, run, cpu_s))
    return 0 if all(result.ok for result in run.results) else 1


if __name__ == "__main__":
    sys.exit(main())
