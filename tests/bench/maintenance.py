"""A simulated hour of 10 s commits into 10 tables, then table maintenance: what it changes.

    PYTHONPATH=tests python -m bench.maintenance                     # 360 rounds, 10 tables
    PYTHONPATH=tests python -m bench.maintenance --rounds 30 --tables 2 --out /tmp/m

The hour is streamed by the real worker and coordinator (:mod:`.hour_ingest`) into a fresh SQLite
catalog on the local broker (``fanout-sink stack``, started when down, or ``--bootstrap-servers``).
Then every table is measured (:mod:`.table_health`: data files, snapshots, manifests, metadata
bytes, and the median time of a full count and a filtered query through PyIceberg and Spark SQL),
maintained once with ``maintain()`` as ``fanout-sink maintain`` does (keeping the last
``--keep-minutes`` simulated minutes of snapshots, at least one), and measured again. Results go to
``<out>/maintenance.md`` and ``<out>/maintenance.json``, with the command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.hour_ingest import (
    HourIngest,
    HourPlan,
    IngestResult,
    create_tables,
    create_topic,
    sink_config,
)
from bench.table_health import FILTER_MINUTES, SCANS, TableHealth, measure
from fanout_sink.catalog import CatalogSettings, load_catalog, spark_catalog_conf
from fanout_sink.devtools.stack import daemon
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.maintenance.report import TableMaintenance
from fanout_sink.spark.maintenance import maintain


@dataclass(frozen=True)
class MaintenanceChoice:
    """The settings a user would pick for this hour: keep the snapshots of the last ``keep_minutes``
    (simulated) minutes and at least one, compact partitions with ``min_input_files`` small files
    (``None``: the sink's default), orphan safety age at its default."""

    keep_minutes: float = 10.0
    min_input_files: int | None = None

    def settings(self, plan: HourPlan, ingest: IngestResult, now_ms: int) -> dict[str, Any]:
        """The ``maintenance:`` section. Time is compressed, so ``max-snapshot-age`` is the real time
        since the last round older than ``keep_minutes`` simulated minutes: its snapshots and all
        before it expire (those committed while maintenance runs before expiry may go too)."""
        section: dict[str, Any] = {"min-snapshots-to-keep": 1}
        if self.min_input_files is not None:
            section["min-input-files"] = self.min_input_files
        kept_rounds = int(self.keep_minutes * 60 / plan.interval_s)
        if kept_rounds < len(ingest.round_done_ms):
            last_expired_ms = ingest.round_done_ms[-kept_rounds - 1]
            section["max-snapshot-age"] = f"{max(1, now_ms - last_expired_ms)}ms"
        return section


@dataclass
class BenchResult:
    plan: HourPlan
    ingest: IngestResult
    before: list[TableHealth] = field(default_factory=list)
    after: list[TableHealth] = field(default_factory=list)
    maintenance_settings: dict[str, Any] = field(default_factory=dict)
    maintenance_s: float = 0.0
    maintained: list[TableMaintenance] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": vars(self.plan),
            "ingest": self.ingest.to_json(),
            "before": [t.to_json() for t in self.before],
            "after": [t.to_json() for t in self.after],
            "maintenance": {
                "settings": self.maintenance_settings,
                "seconds": round(self.maintenance_s, 3),
                "tables": [asdict(t) for t in self.maintained],
            },
        }


def catalog_settings(folder: Path) -> CatalogSettings:
    """A fresh embedded catalog under a name of its own (Spark caches catalogs by name)."""
    return CatalogSettings(
        name=f"maint_{uuid.uuid4().hex[:8]}",
        type="sql",
        uri=f"sqlite:///{folder / 'catalog.db'}",
        warehouse=f"file://{folder / 'warehouse'}",
    )


def measure_all(
    catalog: Any, plan: HourPlan, ingest: IngestResult, spark: Any, spark_catalog: str, repeat: int
) -> list[TableHealth]:
    since = dt.datetime.fromtimestamp(ingest.end_ms / 1000 - FILTER_MINUTES * 60, tz=dt.UTC)
    return [measure(catalog, table, since, repeat, spark, spark_catalog) for table in plan.table_names()]


def run(
    plan: HourPlan,
    bootstrap: str,
    settings: CatalogSettings,
    spark: Any,
    choice: MaintenanceChoice | None = None,
    repeat: int = 3,
    parallel: int = 2,
) -> BenchResult:
    """Stream the hour, measure every table, maintain them all, measure again. ``spark`` gets the
    catalog registered by name."""
    choice = choice or MaintenanceChoice()
    for key, value in spark_catalog_conf(settings).items():
        spark.conf.set(key, value)
    catalog = load_catalog(settings)
    name = f"maintbench-{uuid.uuid4().hex[:6]}"
    topic = f"{name}-events"
    config = sink_config(name, bootstrap, topic, settings, plan)
    create_topic(bootstrap, topic, plan.partitions)
    create_tables(catalog, plan)
    try:
        ingest = HourIngest(config, catalog, plan, parallel=parallel).run()
        result = BenchResult(plan, ingest)
        print(f"ingest done: {ingest.records:,} records, {ingest.records_per_s:,.0f} records/s", flush=True)
        result.before = measure_all(catalog, plan, ingest, spark, settings.name, repeat)
        result.maintenance_settings = choice.settings(plan, ingest, int(time.time() * 1000))
        config = sink_config(name, bootstrap, topic, settings, plan, result.maintenance_settings)
        started = time.perf_counter()
        result.maintained = maintain(spark, config)
        result.maintenance_s = time.perf_counter() - started
        failed = [
            (t.table, s.name, s.detail) for t in result.maintained for s in t.steps if s.action == "failed"
        ]
        if failed:
            raise RuntimeError(f"maintenance failed: {failed}")
        result.after = measure_all(catalog, plan, ingest, spark, settings.name, repeat)
    finally:
        # This run's topics only: dropped so repeated runs do not fill the broker's disk.
        KafkaClientFactory({"bootstrap.servers": bootstrap}).admin().delete_topics(
            [topic, config.control_topic]
        )
    return result


def _total(tables: list[TableHealth]) -> dict[str, float]:
    files = sum(t.data_files for t in tables)
    data_bytes = sum(t.data_bytes for t in tables)
    out: dict[str, float] = {
        "rows": sum(t.rows for t in tables),
        "rows of the filtered query": sum(t.filtered_rows for t in tables),
        "data files": files,
        "average data file KB": data_bytes / files / 1024 if files else 0.0,
        "snapshots": sum(t.snapshots for t in tables),
        "manifests listed by the current snapshot": sum(t.manifests for t in tables),
        "of which with live files": sum(t.live_manifests for t in tables),
        "metadata files": sum(t.metadata_files for t in tables),
        "metadata MB (JSON + manifest lists + manifests)": sum(t.metadata_bytes for t in tables) / 1e6,
        "of which metadata JSON MB": sum(t.metadata_json_bytes for t in tables) / 1e6,
    }
    for scan in SCANS:
        times = [t.scan_s[scan] for t in tables if scan in t.scan_s]
        if times:
            out[f"{_scan_name(scan)} s (sum over tables)"] = sum(times)
    return out


def _scan_name(scan: str) -> str:
    engine, query = scan.split("_")
    engine = "PyIceberg" if engine == "pyiceberg" else "Spark SQL"
    return f"{engine} {'count(*)' if query == 'count' else 'filtered'}"


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.3f}"


def _change(before: float, after: float) -> str:
    return f"{after / before:.2f}x" if before else "-"


def _arrow(before: float, after: float, digits: int = 0) -> str:
    return f"{before:,.{digits}f} → {after:,.{digits}f}"


def markdown(result: BenchResult, command: str) -> str:
    plan, ingest = result.plan, result.ingest
    before, after = _total(result.before), _total(result.after)
    lines = [
        "# Table maintenance benchmark: a simulated hour of commits",
        "",
        f"`{command}`",
        "",
        f"{plan.rounds} commit rounds of {plan.interval_s:g} s (a simulated {plan.simulated_s / 60:g} min) "
        f"into {plan.tables} tables (hourly partitions), {plan.partitions} source partitions, {plan.records} "
        f"records per partition per round: {ingest.records:,} records. Each round is real worker slices "
        "(Kafka transactions, Parquet) and one real coordinator commit round; only the waits between "
        "rounds are left out.",
        "",
        f"Ingest: {ingest.records_per_s:,.0f} records/s over the sink's own {ingest.sink_s:,.1f} s (slices "
        f"{ingest.slice_s:,.1f} s, commit rounds {ingest.commit_s:,.1f} s; producing excluded). Median "
        f"commit round: {ingest.commit_median_s(first=True):.3f} s in the first 10 rounds, "
        f"{ingest.commit_median_s(first=False):.3f} s in the last 10.",
        "",
        f"Maintenance (`fanout_sink.spark.maintenance.maintain`, `maintenance: "
        f"{json.dumps(result.maintenance_settings)}`): {result.maintenance_s:,.1f} s for all tables.",
        "",
        "## Totals",
        "",
        "| measure | before | after | after / before |",
        "|---|---:|---:|---:|",
        *[
            f"| {k} | {_number(v)} | {_number(after[k])} | {_change(v, after[k])} |"
            for k, v in before.items()
        ],
        "",
        "## Per table (before → after)",
        "",
        "| table | data files | avg file KB | snapshots | live manifests | metadata MB | "
        + " | ".join(f"{_scan_name(s)} ms" for s in SCANS)
        + " | compact + manifests + expire s |",
        "|---" + "|---:" * (6 + len(SCANS)) + "|",
    ]
    # Orphan cleanup runs once for all tables after the per-table steps: its time is in the total.
    durations = {
        t.table: sum(s.duration_s for s in t.steps if s.name in ("compact", "manifests", "expire"))
        for t in result.maintained
    }
    for old, new in zip(result.before, result.after, strict=True):
        scans = " | ".join(
            _arrow(old.scan_s[s] * 1000, new.scan_s[s] * 1000) if s in old.scan_s else "-" for s in SCANS
        )
        lines.append(
            f"| {old.table} | {_arrow(old.data_files, new.data_files)} | "
            f"{_arrow(old.average_file_kb, new.average_file_kb, 1)} | "
            f"{_arrow(old.snapshots, new.snapshots)} | {_arrow(old.live_manifests, new.live_manifests)} | "
            f"{_arrow(old.metadata_bytes / 1e6, new.metadata_bytes / 1e6, 2)} | {scans} | "
            f"{durations.get(old.table, 0.0):.1f} |"
        )
    lines += [
        "",
        "## Reading the figures",
        "",
        "- Time is compressed: `max-snapshot-age` is fixed when maintenance starts and the tables are "
        "maintained one after the other, so the later ones keep fewer of the last minutes' snapshots.",
        "- Expiry deletes the expired snapshots' manifest lists and manifests, not the old metadata JSON "
        "files (Iceberg keeps those unless `write.metadata.delete-after-commit.enabled` is set), so the "
        "metadata JSON bytes do not fall.",
        "- Times are medians of the runs of each query, measured on the machine as it was: compare the "
        "before and after columns of one run, not runs on different machines.",
    ]
    lines += ["", "## What maintenance did", ""]
    for table in result.maintained:
        steps = "; ".join(f"{s.name} {s.action} ({s.detail})" for s in table.steps)
        lines.append(f"- {table.table}: {steps}")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = HourPlan()
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="commit rounds (default 360)")
    parser.add_argument("--tables", type=int, default=defaults.tables, help="tables (default 10)")
    parser.add_argument("--partitions", type=int, default=defaults.partitions, help="source partitions")
    parser.add_argument(
        "--records", type=int, default=defaults.records, help="records per partition per round (default 200)"
    )
    parser.add_argument(
        "--interval", type=float, default=defaults.interval_s, help="simulated seconds per round"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per timed query; the median is kept")
    parser.add_argument(
        "--keep-minutes", type=float, default=10.0, help="simulated minutes of snapshots expiry keeps (10)"
    )
    parser.add_argument("--min-input-files", type=int, help="maintenance's min-input-files (its default: 5)")
    parser.add_argument("--cores", type=int, default=2, help="local[N] for Spark, parallel slices")
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="maintenance.md and .json")
    parser.add_argument("--work-dir", type=Path, help="catalog and warehouse (default: a temporary folder)")
    return parser


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """``spark``: a session to use (tests share theirs); default a ``local[--cores]`` one."""
    args = _parser().parse_args(argv)
    plan = HourPlan(args.rounds, args.tables, args.partitions, args.records, args.interval)
    bootstrap = args.bootstrap_servers or daemon.up(daemon.default_dir())[0].bootstrap_servers
    command = "PYTHONPATH=tests python -m bench.maintenance " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="maintenance-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = catalog_settings(work)
    own_session = spark is None
    if own_session:
        from fanout_sink.spark.session import build_spark_session

        spark = build_spark_session(settings, master=f"local[{args.cores}]", app_name="maintenance-bench")
    try:
        choice = MaintenanceChoice(args.keep_minutes, args.min_input_files)
        result = run(plan, bootstrap, settings, spark, choice, args.repeat, args.cores)
    finally:
        if own_session:
            spark.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(result, command)
    (args.out / "maintenance.md").write_text(text)
    (args.out / "maintenance.json").write_text(json.dumps({**result.to_json(), "command": command}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
