"""fanout_sink next to the Iceberg Kafka Connect sink, Spark's own writer and the in-process limit.

    PYTHONPATH=tests python -m bench.side_by_side                      # everything, 1M records, 3 rounds
    PYTHONPATH=tests python -m bench.side_by_side --records 20000 --rounds 1 --variants uniform-3
    PYTHONPATH=tests python -m bench.side_by_side --cores 1 --systems continuous
    PYTHONPATH=tests python -m bench.side_by_side --latency --rate 20000 --duration 120
    PYTHONPATH=tests python -m bench.side_by_side --soak --duration 1800 --load 0.7
    PYTHONPATH=tests python -m bench.side_by_side --cores 1 --taskset 0 --systems continuous,connect

Per variant the records are generated once, written to a fresh topic (2 partitions, or
``--partitions``) on the local broker (``fanout-sink stack``, started when down) and to a file for
the in-process limit. Each
round runs every chosen system once, in an order rotated per round, each into a fresh catalog;
after each run the ids per table are compared with the generated ones. Results merge into
``<out>/results.json``; ``<out>/throughput.md`` and ``<out>/throughput.png`` are rendered from it.
The records are generated, written and produced a chunk at a time, so ``--records 10000000`` never
holds them in memory. ``--taskset`` pins every system's process tree (see ``proctree.run_child``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyspark

from bench import (
    connect_peer,
    latency,
    limit,
    ours,
    python_source,
    report,
    soak,
    spark_writer,
)
from bench.context import PARTITIONS, RunContext, SystemRun
from bench.end_to_end import produce_chunks
from bench.landed import TableLanding, check_same_rows, commit_gaps, sorted_ids
from bench.workload import NAMESPACE, ROUTE_FIELD, Variant, parse_variant, value_chunks
from fanout_sink.config.loading import key_value
from fanout_sink.devtools.stack import daemon
from fanout_sink.kafka.clients import KafkaClientFactory

SYSTEMS: dict[str, Callable[[RunContext], SystemRun]] = {
    "available-now": ours.available_now,
    "continuous": ours.continuous,
    "connect": connect_peer.run,
    "spark": spark_writer.run,
    "limit": limit.run,
    "python-source": python_source.run,
}
GENERATED = "the generated records"


def expected_landing(values_file: Path, variant: Variant) -> dict[str, TableLanding]:
    """The ids each table must hold, read back from the records file (route field -> table)."""
    schema = pa.schema([("id", pa.string()), (ROUTE_FIELD, pa.string())])
    rows = pj.read_json(
        values_file,
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    out = {}
    for table in variant.table_names():
        ids = rows.filter(pc.equal(rows[ROUTE_FIELD], table.removeprefix(f"{NAMESPACE}.")))["id"]
        out[table] = TableLanding(ids=sorted_ids(ids), data_files=0, snapshots=0)
    return out


def machine_facts() -> dict[str, str]:
    """The machine and the releases every benchmark's figures depend on."""
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    memory_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
    return {
        "cores": str(os.cpu_count()),
        "RAM": f"{memory_kb / 1e6:.0f} GB",
        "CPU": cpu or platform.machine(),
        "Python": platform.python_version(),
        "PySpark": pyspark.__version__,
        "Java": java.split("\n")[0].replace('"', ""),
    }


def connect_facts() -> dict[str, str]:
    """The releases the Connect peer runs (fetches its jars when missing)."""
    return {
        "Iceberg (Connect peer)": connect_peer.iceberg_version(),
        "Kafka Connect": connect_peer.kafka_version(),
    }


def _measure(
    ctx: RunContext, key: str, round_no: int, expected: dict[str, TableLanding], megabytes: float
) -> report.Measurement:
    started_ms = int(time.time() * 1000)
    run = SYSTEMS[key](ctx)
    first_commit_s, max_gap_s = commit_gaps(run.landing, started_ms)
    print(
        f"  round {round_no + 1} {run.system}: {ctx.records / run.wall_s:,.0f} records/s, "
        f"{run.cpu_s:.1f} CPU s, peak RSS {run.peak_rss_mb:,.0f} MB, first commit after "
        f"{first_commit_s or 0:.1f} s, longest gap between a table's commits {max_gap_s or 0:.1f} s",
        flush=True,
    )
    check_same_rows((GENERATED, expected), (run.system, run.landing))
    tables = ctx.variant.table_names()
    return report.Measurement(
        cores=ctx.cores,
        variant=ctx.variant.name,
        round=round_no,
        system=run.system,
        records=ctx.records,
        megabytes=megabytes,
        wall_s=run.wall_s,
        cpu_s=run.cpu_s,
        peak_rss_mb=run.peak_rss_mb,
        worker_rss_mb=run.worker_rss_mb,
        steady_s=run.steady_s,
        first_commit_s=first_commit_s,
        max_commit_gap_s=max_gap_s,
        files_per_table=[run.landing[t].data_files for t in tables],
        snapshots_per_table=[run.landing[t].snapshots for t in tables],
        pss_mb=run.pss_mb,
        role_rss_mb=run.role_rss_mb,
        role_processes=run.role_processes,
        role_cpu_s=run.role_cpu_s,
        taskset=ctx.taskset,
    )


def _write_and_produce(
    bootstrap: str, topic: str, values_file: Path, chunks: Iterable[list[bytes]], partitions: int
) -> float:
    """Write the records to ``values_file`` and produce them to a new ``topic`` of ``partitions``, one
    chunk in memory at a time; returns their megabytes."""
    size = 0

    def written() -> Iterator[tuple[None, list[bytes]]]:
        nonlocal size
        with values_file.open("wb") as out:
            for chunk in chunks:
                out.write(b"\n".join(chunk) + b"\n")
                size += sum(len(v) for v in chunk)
                yield None, chunk

    produce_chunks(bootstrap, topic, written(), partitions)
    return size / 1e6


def throughput(args: argparse.Namespace, bootstrap: str, work: Path) -> list[report.Measurement]:
    measurements = []
    for variant in args.variants:
        values_file = work / f"{variant.name}.jsonl"
        topic = f"side-by-side-{variant.name}-{uuid.uuid4().hex[:6]}"
        megabytes = _write_and_produce(
            bootstrap, topic, values_file, value_chunks(variant, args.records), args.partitions
        )
        expected = expected_landing(values_file, variant)
        print(f"{variant.name}: {args.records:,} records, {megabytes:.1f} MB on topic {topic}", flush=True)
        for round_no in range(args.rounds):
            order = (
                args.systems[round_no % len(args.systems) :] + args.systems[: round_no % len(args.systems)]
            )
            for key in order:
                ctx = RunContext(
                    bootstrap=bootstrap,
                    topic=topic,
                    variant=variant,
                    records=args.records,
                    values_file=values_file,
                    commit_interval_s=args.commit_interval,
                    cores=args.cores,
                    max_offsets_per_trigger=args.max_offsets_per_trigger,
                    folder=work / variant.name / f"r{round_no}-{key}",
                    taskset=args.taskset,
                    spark=dict(args.spark) or None,
                )
                measurements.append(_measure(ctx, key, round_no, expected, megabytes))
                if not args.keep:
                    shutil.rmtree(ctx.folder, ignore_errors=True)
        # The input topic is this variant's only: dropped so repeated runs do not fill the broker's disk.
        admin = KafkaClientFactory(
            {"bootstrap.servers": bootstrap}
        ).admin()  # held: the futures die with the client
        admin.delete_topics([topic])[topic].result(timeout=30)
    return measurements


def command_key(args: argparse.Namespace) -> str:
    """The throughput run's key in results.json's commands: what it measured, so a run of other
    systems, variants, cores, pinning or size sits beside the earlier ones instead of replacing them."""
    key = f"throughput, --cores {args.cores}" + (f" --taskset {args.taskset}" if args.taskset else "")
    key += "".join(f" --spark {name}={value}" for name, value in args.spark)
    if args.records != report.STANDARD_RECORDS:
        key += f" --records {args.records}"
    if args.partitions != PARTITIONS:
        key += f" --partitions {args.partitions}"
    variants = ",".join(variant.name for variant in args.variants)
    return f"{key} --systems {','.join(args.systems)} --variants {variants}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--variants",
        default="uniform-3,uniform-50,mixed-3,mixed-50",
        help="comma-separated <uniform|mixed>-<tables>",
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated of {', '.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count() or 2,
        help="local[N] for the Spark systems, tasks.max for Connect",
    )
    parser.add_argument(
        "--commit-interval", type=float, default=10.0, help="seconds, for the sink and Connect"
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="records per micro-batch for the sink (and Spark's writer); default: unset, as a user runs it",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=PARTITIONS,
        help="source partitions of each variant's topic (the in-process limit keeps its own split)",
    )
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="results.json, .md, .png")
    parser.add_argument("--work-dir", type=Path, help="run folders (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep every run's catalog, warehouse and log")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--latency", action="store_true", help="the produce-to-visible latency mode instead")
    parser.add_argument("--rate", type=float, help="latency mode: records/s (default: half the capacity)")
    parser.add_argument(
        "--duration", type=float, help="latency / soak mode: seconds of producing (default 120 / 1800)"
    )
    parser.add_argument("--soak", action="store_true", help="the soak mode (see bench/soak.py) instead")
    parser.add_argument("--load", type=float, default=0.7, help="soak mode: share of the measured capacity")
    parser.add_argument("--warm-up", type=float, default=300.0, help="soak mode: seconds not judged")
    parser.add_argument(
        "--sample-interval", type=float, default=10.0, help="soak mode: seconds between samples"
    )
    parser.add_argument(
        "--maintenance",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="latency / soak mode: a key of the sink YAML's maintenance section "
        "(--maintenance max-snapshot-age=10m), as a production sink would run",
    )
    parser.add_argument(
        "--spark",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of the sink YAML's spark section (--spark groups-per-task=2), for an A/B of a setting",
    )
    parser.add_argument(
        "--taskset",
        help="CPUs to pin every system's process tree to, taskset -c syntax: 0 or 0-1 (recorded per run)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; pick from {', '.join(SYSTEMS)}")
    bootstrap = args.bootstrap_servers or daemon.up(daemon.default_dir())[0].bootstrap_servers
    command = "PYTHONPATH=tests python -m bench.side_by_side " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="side-by-side-"))
    work.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    try:
        if args.soak:
            args.duration = args.duration or 1800.0
            soaked = {**soak.measure(args, bootstrap, work, results), "command": command}
            report.merge(results, "soak", lambda _: soaked)
            (args.out / "soak.md").write_text(soak.markdown(soaked))
        elif args.latency:
            args.duration = args.duration or 120.0
            measured = latency.measure(args, bootstrap, work, results)
            report.merge(results, "latency", lambda _: {**measured, "command": command})
        else:
            if "connect" in args.systems:
                connect_peer.kafka_version()  # fetch both jar sets before anything is timed
                connect_peer.iceberg_version()
            new = throughput(args, bootstrap, work)
            report.merge(results, "measurements", lambda old: report.merge_measurements(old, new))
            key = command_key(args)
            report.merge(results, "commands", lambda old: {**(old or {}), key: command})
            report.merge(results, "commit_interval_s", lambda _: args.commit_interval)
        data = report.merge(results, "machine", lambda _: {**machine_facts(), **connect_facts()})
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    (args.out / "throughput.md").write_text(report.markdown(data))
    if not args.no_chart:
        report.chart(data, args.out / "throughput.png")
    print(f"wrote {args.out / 'throughput.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
