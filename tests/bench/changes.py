"""fanout_sink's change path next to Spark ``foreachBatch`` + ``MERGE INTO`` on one Debezium stream.

    PYTHONPATH=tests python -m bench.changes                          # 1M keys, 2M changes
    PYTHONPATH=tests python -m bench.changes --keys 20000 --events 40000 --out /tmp/changes

The stream (:mod:`.change_stream`) is generated once and produced keyed by id to a fresh topic
with 2 partitions on the local broker (``fanout-sink stack``, started when down, or
``--bootstrap-servers``). Each system gets a fresh SQLite catalog whose table already holds the
source's rows, runs over the whole topic with an available-now trigger as one measured process
tree (:mod:`.proctree`), and leaves its table to be checked key by key against the model and
measured before and after maintenance (:mod:`.change_state`) in one Spark session started after
all systems ran. Results: ``<out>/changes.json`` and ``<out>/changes.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from bench import change_report, merge_peer, ours
from bench.change_state import ReadCost, StateCheck, check_state, examine
from bench.change_stream import (
    KEY,
    SOURCE_TABLE,
    TABLE,
    ChangePlan,
    ChangeStream,
    create_table,
    generate,
)
from bench.context import child_env
from bench.end_to_end import produce_chunks
from bench.proctree import ChildRun, run_child
from bench.side_by_side import machine_facts
from fanout_sink.catalog import CatalogSettings, load_catalog, spark_catalog_conf
from fanout_sink.devtools.stack import daemon
from fanout_sink.kafka.clients import KafkaClientFactory


@dataclass(frozen=True)
class SystemInput:
    """What one system's run gets: the shared topic and its own folder and catalog."""

    bootstrap: str
    topic: str
    folder: Path
    settings: CatalogSettings
    cores: int
    commit_interval_s: float
    max_offsets_per_trigger: int

    @property
    def master(self) -> str:
        return f"local[{self.cores}]"


def sink_config(run: SystemInput, name: str) -> dict[str, Any]:
    """The sink's YAML: the Debezium topic's ``customers`` events into the table, by key."""
    tables = {
        TABLE: {"when": f"source.table == '{SOURCE_TABLE}'", "changes": {"format": "debezium", "key": [KEY]}}
    }
    return ours.app_config(
        name, run.bootstrap, run.topic, run.commit_interval_s, run.settings, run.master, run.folder, tables
    )


def run_ours(run: SystemInput) -> ChildRun:
    """``fanout-sink run --available-now`` over the topic; a failed run stops the benchmark."""
    name = f"changes-{uuid.uuid4().hex[:8]}"
    config = run.folder / "sink.yaml"
    config.write_text(yaml.safe_dump(sink_config(run, name)))
    log = run.folder / "app.log"
    command = ours.app_command(config, run.master, run.max_offsets_per_trigger, ["--available-now"])
    child = run_child(command, env=child_env(), log=log)
    if child.returncode != 0:
        raise child.failure(change_report.OURS, log)
    _drop_topics(run.bootstrap, [f"{name}-control"])  # this run's only: rounds would fill the broker's disk
    return child


def _drop_topics(bootstrap: str, topics: list[str]) -> None:
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()  # held: the futures die with it
    for future in admin.delete_topics(topics).values():
        future.result(timeout=30)


def run_merge_peer(run: SystemInput) -> ChildRun:
    return merge_peer.run(
        run.bootstrap,
        run.topic,
        run.settings,
        run.master,
        str(run.folder / "checkpoint"),
        run.max_offsets_per_trigger,
        child_env(),
        run.folder / "merge-peer.log",
    )


@dataclass(frozen=True)
class System:
    """A system the benchmark runs: its name, how to run it, where its log says start-up ended."""

    name: str
    start: Callable[[SystemInput], ChildRun]
    first_batch_started: Callable[[str], float | None]


SYSTEMS = {
    "merge": System(merge_peer.SYSTEM, run_merge_peer, merge_peer.first_batch_started),
    "ours": System(change_report.OURS, run_ours, ours.first_batch_started),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = ChangePlan()
    parser.add_argument("--keys", type=int, default=defaults.keys, help="source rows before the stream")
    parser.add_argument("--events", type=int, default=defaults.events, help="change events")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated of {', '.join(SYSTEMS)}"
    )
    parser.add_argument("--cores", type=int, default=2, help="local[N] for every Spark")
    parser.add_argument("--commit-interval", type=float, default=10.0, help="the sink's, in seconds")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs per system, order rotated per round")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timed read; the median is kept")
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="changes.json and .md")
    parser.add_argument("--work-dir", type=Path, help="run folders (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keys = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in keys if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; pick from {', '.join(SYSTEMS)}")
    command = "PYTHONPATH=tests python -m bench.changes " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    plan = ChangePlan(keys=args.keys, events=args.events, seed=args.seed)
    load_before = os.getloadavg()[0]  # a shared machine's figures are not a quiet one's: say which
    started = time.perf_counter()
    stream = generate(plan)
    print(
        f"generated {plan.events:,} changes over {plan.keys:,} keys "
        f"in {time.perf_counter() - started:.1f} s: "
        f"{stream.ops}; the model holds {stream.final.num_rows:,} rows",
        flush=True,
    )
    bootstrap = args.bootstrap_servers or daemon.up(daemon.default_dir())[0].bootstrap_servers
    topic = f"changes-{uuid.uuid4().hex[:8]}"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="changes-bench-"))
    results: list[change_report.SystemResult] = []
    try:
        produce_s = produce_chunks(bootstrap, topic, stream.batches())
        print(f"produced to {topic} in {produce_s:.1f} s", flush=True)
        runs: dict[str, list[tuple[SystemInput, change_report.Round]]] = {key: [] for key in keys}
        for round_no in range(args.rounds):
            for key in keys[round_no % len(keys) :] + keys[: round_no % len(keys)]:  # rotated per round
                runs[key].append(_run(key, round_no, stream, args, bootstrap, topic, work))
        results = _examine(runs, stream.final, args)
    finally:
        _drop_topics(bootstrap, [topic])
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    data = {
        "command": command,
        "plan": asdict(plan),
        "ops": stream.ops,
        "produce_s": round(produce_s, 3),
        "repeat": args.repeat,
        "rounds": args.rounds,
        "machine": machine_facts(),
        "load_average": round(load_before, 2),
        "systems": [r.to_json(plan.events) for r in results],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "changes.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    text = change_report.markdown(data)
    (args.out / "changes.md").write_text(text)
    print(text)
    return 1 if any(r.mismatches for r in results) else 0


def _run(
    key: str,
    round_no: int,
    stream: ChangeStream,
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    work: Path,
) -> tuple[SystemInput, change_report.Round]:
    """One system over the whole topic, into a fresh catalog whose table holds the initial rows."""
    system = SYSTEMS[key]
    folder = work / f"r{round_no}-{key}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    settings = CatalogSettings(
        name=f"cdc_{key}_{uuid.uuid4().hex[:6]}",
        type="sql",
        uri=f"sqlite:///{folder / 'catalog.db'}",
        warehouse=f"file://{folder / 'warehouse'}",
    )
    create_table(load_catalog(settings), stream.initial)
    run = SystemInput(
        bootstrap, topic, folder, settings, args.cores, args.commit_interval, args.max_offsets_per_trigger
    )
    launched = time.time()
    child = system.start(run)
    first_batch = system.first_batch_started(child.stderr)
    done = change_report.Round(child, first_batch - launched if first_batch is not None else None)
    print(
        f"round {round_no + 1} {system.name}: {stream.plan.events / child.wall_s:,.0f} change events/s "
        f"({done.startup_text()}), {child.cpu_s:.1f} CPU s, peak RSS {child.peak_rss_mb:,.0f} MB",
        flush=True,
    )
    return run, done


def _examine(
    runs: dict[str, list[tuple[SystemInput, change_report.Round]]], model: pa.Table, args: argparse.Namespace
) -> list[change_report.SystemResult]:
    """Check every round's table key by key; measure and maintain each system's last one in one
    Spark session (started after all runs, so it never competes with a measured system).
    Mismatches are printed as they are found."""
    if not runs:
        return []
    from fanout_sink.spark.session import build_spark_session

    first = next(iter(runs.values()))[0][0]
    spark = build_spark_session(first.settings, master=f"local[{args.cores}]", app_name="changes-bench")
    try:
        results = []
        for key, rounds in runs.items():
            system = SYSTEMS[key].name
            earlier = [
                check_state(load_catalog(run.settings).load_table(TABLE).scan().to_arrow(), model)
                for run, _ in rounds[:-1]
            ]
            for round_no, check in enumerate(earlier):
                _print_check(f"{system}, round {round_no + 1}", check, None)
            last = rounds[-1][0]
            for conf_key, value in spark_catalog_conf(last.settings).items():
                spark.conf.set(conf_key, value)
            replica = examine(load_catalog(last.settings), spark, last.settings.name, model, args.repeat)
            _print_check(f"{system}, round {len(rounds)}, after the stream", replica.check, replica.before)
            _print_check(
                f"{system}, round {len(rounds)}, after maintenance", replica.after_check, replica.after
            )
            results.append(change_report.SystemResult(system, [r for _, r in rounds], replica, earlier))
        return results
    finally:
        spark.stop()


def _print_check(what: str, check: StateCheck, cost: ReadCost | None) -> None:
    counted = f", Spark SQL counts {cost.spark_rows:,}" if cost is not None else ""
    print(
        f"{what}: {check.mismatches:,} keys differ from the model ({check.rows:,} rows{counted}, "
        f"model {check.expected:,})",
        flush=True,
    )
    for example in check.examples:
        print(f"  {example}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
