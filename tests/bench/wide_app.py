"""A wide sink sustained: the real app fed continuously, N tables from N partitions (issue 32's first target).

    PYTHONPATH=tests python -m bench.wide_app --tables 5000 --rounds 10 --commit-interval 60 \\
        --rate 2000 --bootstrap-servers HOST:PORT

A Debezium-like layout: one topic of N partitions, partition ``i`` carrying only the records of table
``bench.t<i>`` (its route field ``table``), into N tables created up front and routed by
``dynamic.table``. Once the app's streaming query runs, a producer sends ``--rate`` records a second,
record ``n`` to partition ``n % N``, for ``--warm-up`` seconds plus ``--rounds`` commit intervals, so
every table receives data in every round. The app is ``fanout-sink run`` in continuous mode, one
micro-batch per ``--trigger-interval``, with its default partition groups (the cores of ``local[N]``)
and its default distributed commits (a round of 50 tables or more commits in a Spark job).

Every ``--sample-interval`` seconds it notes two lags and the tree's RSS: the sink group's lag (last
stable minus committed offsets: records the workers have not delivered) and the records produced but
not yet visible in the tables (what the coordinator has not committed). After producing ends the app
drains, gets SIGTERM, and every row is counted by its ``seq`` (none missing, none twice, each in its
record's table).

Judged over the rounds after the warm-up: the visible lag does not grow (its least-squares slope over
the judged samples adds less than one round's records across them); every commit round's table
commits (from the tables' snapshots, grouped by commit id) span less than the interval; Spark tasks
per batch (the partition groups) at most 4x the cores.

Per-table cadence (issue 50's target, :mod:`bench.cadence`): ``--hot-share 0.05 --hot-records 0.9``
gives the first 5% of the tables 90% of the records (every table still gets data every round) and
declares them under ``tables:`` (no interval of their own: every round); ``--cold-commit-interval S``
gives every other table ``dynamic.commit-interval``. Each run then reports, from its tables'
snapshots over the judged window: snapshots per hour, data files per table, the hot and the cold
tables' VTTS age (median and max, sampled every 5 s) and the rounds' tables. Run it twice with the
same skew, without and with the interval, into one ``--out`` under two ``--label``s; the second
with ``--compare-with <the first's label>`` prints the ratios against the target. With a cold
interval the drain waits for the cold tables' next period (at least 2 intervals by default).

    PYTHONPATH=tests python -m bench.wide_app --tables 5000 --rounds 10 --commit-interval 60 --rate 2000 \\
        --hot-share 0.05 --hot-records 0.9 --label 5000-skew --out wide-app.json
    PYTHONPATH=tests python -m bench.wide_app --tables 5000 --rounds 10 --commit-interval 60 --rate 2000 \\
        --hot-share 0.05 --hot-records 0.9 --cold-commit-interval 600 --label 5000-cadence \\
        --compare-with 5000-skew --out wide-app.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from bench import cadence, ours
from bench.backlog import CommitRound, commit_rounds
from bench.cadence import CadenceFacts, RoundLine
from bench.context import RunContext
from bench.hour_ingest import create_topic
from bench.process_cpu import read_stat
from bench.proctree import TreeUsage, run_child
from bench.side_by_side import machine_facts
from bench.soak import ExactRows, count_rows, group_lag, produce_steadily, record, templates
from bench.workload import NAMESPACE, Variant
from fanout_sink.devtools.stack import daemon
from fanout_sink.devtools.stack.broker import load_state
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.protocol.channel import sink_group

SYSTEM = "fanout_sink wide"
TASKS_PER_CORE = 4
"""The issue's bound: Spark tasks per batch at most 4x the cores."""
_POOL = 20_000
_STARTED = "streaming query"
LOG = "app.log"


@dataclass(frozen=True)
class Sample:
    """One look at the running sink, ``at_s`` seconds after producing began."""

    at_s: float
    produced: int
    group_lag: int
    """Records the workers have not delivered (last stable offsets minus the sink group's)."""
    unseen: int
    """Records produced but not visible in the tables."""
    rss_mb: float
    load1: float


@dataclass
class WideAppResult:
    tables: int
    rate: float
    commit_interval_s: float
    trigger_interval: str
    rounds: int
    warm_up_s: float
    cores: int
    create_tables_s: float
    start_s: float
    """From the app's launch to its streaming query running (Spark, the catalog, the first plan)."""
    produced: int
    feed_s: float
    drain_s: float | None
    """From the end of producing until every produced record was visible; None: not drained."""
    cpu_s: float
    broker_cpu_s: float | None
    """The broker's CPU from producing's start to the end (it shares the machine's cores)."""
    harness_cpu_s: float
    """This benchmark's own CPU meanwhile: the producer, the lag and visible-rows sampling."""
    peak_rss_mb: float
    partition_groups: int | None
    batches: list[tuple[float, int, float]]
    commit_jobs: list[tuple[int, float]]
    rounds_seen: list[CommitRound]
    samples: list[Sample]
    exact: ExactRows | None
    cadence: CadenceFacts | None = None
    round_lines: list[RoundLine] = field(default_factory=list)
    """Every commit round as the coordinator logged it: its tables per outcome, how many waited."""
    facts: dict[str, str] = field(default_factory=dict)
    command: str = ""

    @property
    def round_records(self) -> float:
        return self.rate * self.commit_interval_s

    def judged(self) -> list[Sample]:
        """Samples after the warm-up, while producing."""
        return [s for s in self.samples if self.warm_up_s <= s.at_s <= self.feed_s]

    def lag_growth(self) -> float | None:
        """Records the visible lag grew by over the judged samples (least-squares slope x span)."""
        judged = self.judged()
        if len(judged) < 3:
            return None
        at = [s.at_s for s in judged]
        slope = statistics.linear_regression(at, [float(s.unseen) for s in judged]).slope
        return slope * (at[-1] - at[0])

    def lag_steady(self) -> bool | None:
        growth = self.lag_growth()
        return None if growth is None else growth < self.round_records

    def steady_rounds(self) -> list[CommitRound]:
        """Commit rounds of (nearly) every table: the sink's interval rounds, not the final drain's."""
        return [r for r in self.rounds_seen if r.tables >= 0.9 * self.tables]

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "lag_growth": self.lag_growth(),
            "lag_steady": self.lag_steady(),
            "rounds_over_interval": sum(1 for r in self.steady_rounds() if r.span_s > self.commit_interval_s),
        }


class Watch:
    """The ``done`` of :func:`.proctree.run_child`: starts the producer once the query runs, samples
    the lags and RSS, and holds once producing ended and every record is visible (or the drain's
    deadline passed)."""

    def __init__(self, ctx: RunContext, group: str, args: argparse.Namespace, usage: TreeUsage) -> None:
        self.ctx, self.group, self.args, self.usage = ctx, group, args, usage
        self.clients = KafkaClientFactory({"bootstrap.servers": ctx.bootstrap})
        self.visible = ctx.visible()
        self.launched = time.monotonic()
        self.started: float | None = None
        self.started_at = 0.0
        """When producing began, epoch seconds."""
        self.feed_s = args.warm_up + args.rounds * args.commit_interval
        self.produced = [0]
        self.producer: threading.Thread | None = None
        self.samples: list[Sample] = []
        self.fed_at: float | None = None
        self.drained_at: float | None = None
        self._sampled = float("-inf")
        self.broker_cpu_s: float | None = None
        self.harness_cpu_s = 0.0
        self._cpu_at_start: tuple[float, float | None] = (0.0, None)
        pool = templates(ctx.variant, _POOL, qualified=True)
        slots = skew(args).slots()
        cycle = len(slots)

        def value(n: int) -> tuple[bytes, int]:
            partition = slots[n % cycle]
            return record(n, (f"{NAMESPACE}.t{partition}".encode(), pool[n % _POOL][1])), partition

        self.value = value

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.producer is None:
            log = self.ctx.folder / LOG
            if not (log.exists() and _STARTED in log.read_text(errors="replace")):
                return False
            self.started, self.started_at = now, time.time()
            self._cpu_at_start = self._cpu_now()
            self.producer = threading.Thread(
                target=produce_steadily,
                args=(
                    self.ctx.bootstrap,
                    self.ctx.topic,
                    self.value,
                    self.args.rate,
                    self.feed_s,
                    self.produced,
                ),
                name="wide-producer",
                daemon=True,
            )
            self.producer.start()
        assert self.started is not None
        if self.fed_at is None and not self.producer.is_alive():
            self.fed_at = now
        if now - self._sampled < self.args.sample_interval:
            return False
        self._sampled = now
        produced = self.produced[0]
        visible = self.visible.total()
        sample = Sample(
            round(now - self.started, 1),
            produced,
            group_lag(self.clients, self.group, self.ctx.topic),
            produced - visible,
            round(self.usage.rss_mb),
            os.getloadavg()[0],
        )
        self.samples.append(sample)
        print(
            f"  {sample.at_s:6.0f} s: produced {produced:,}, group lag {sample.group_lag:,}, "
            f"not visible {sample.unseen:,}, RSS {sample.rss_mb:,.0f} MB, load {sample.load1:.2f}",
            flush=True,
        )
        if self.fed_at is None:
            return False
        if visible >= produced:
            self.drained_at = now
        ended = self.drained_at is not None or now - self.fed_at > drain_deadline(self.args)
        if ended:
            (harness, broker), (harness_0, broker_0) = self._cpu_now(), self._cpu_at_start
            self.harness_cpu_s = harness - harness_0
            self.broker_cpu_s = None if broker is None or broker_0 is None else broker - broker_0
        return ended

    def _cpu_now(self) -> tuple[float, float | None]:
        """This process's and the broker's CPU seconds so far (the broker's None if unknown or gone)."""
        broker = read_stat(self.args.broker_pid) if self.args.broker_pid else None
        return time.process_time(), None if broker is None else broker.cpu_s


def skew(args: argparse.Namespace) -> cadence.Skew:
    return cadence.Skew.of(args.tables, args.hot_share, args.hot_records)


def drain_deadline(args: argparse.Namespace) -> float:
    """``--drain-deadline``, else 600 s, and with a cold interval at least two of it (the cold tables'
    rows become visible at their period's end)."""
    if args.drain_deadline is not None:
        return float(args.drain_deadline)
    return max(600.0, 2 * (args.cold_commit_interval or 0.0))


def run(args: argparse.Namespace, bootstrap: str, folder: Path) -> WideAppResult:
    variant = Variant("uniform", args.tables)
    topic = f"wide-app-{args.tables}-{os.urandom(3).hex()}"
    create_topic(bootstrap, topic, args.tables)
    ctx = RunContext(
        bootstrap=bootstrap,
        topic=topic,
        variant=variant,
        records=0,
        values_file=Path(os.devnull),
        commit_interval_s=args.commit_interval,
        cores=args.cores,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        folder=folder,
        taskset=args.taskset,
    )
    try:
        return _run(args, ctx)
    finally:
        # This run's topic and control topic are its own. Dropped: a broker's open files grow with its
        # partitions, and the stack's broker stopped ("Too many open files", 20,000) when a third
        # run's 3,500 partitions joined the 7,000 that two runs had left.
        admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
        control = f"{ctx.unique_name(SYSTEM)}-control"
        for future in admin.delete_topics([topic, control]).values():
            with contextlib.suppress(KafkaException):  # the control topic if the app never made it
                future.result(timeout=60)


def _run(args: argparse.Namespace, ctx: RunContext) -> WideAppResult:
    folder = ctx.folder
    variant = ctx.variant
    started = time.monotonic()
    catalog = ctx.prepare()
    create_tables_s = time.monotonic() - started
    print(f"{args.tables} tables created in {create_tables_s:.0f} s; topic {ctx.topic}", flush=True)
    name = ctx.unique_name(SYSTEM)
    shape = skew(args)
    if shape.hot and shape.cycle > args.rate * args.commit_interval:
        print(
            f"warning: a cycle of {shape.cycle:,} records takes longer than a round at "
            f"{args.rate:g} records/s: some cold tables get no record in some rounds",
            flush=True,
        )
    command = ours.dynamic_command(
        ctx, name, args.trigger_interval, shape.routes(), args.cold_commit_interval
    )
    usage = TreeUsage()
    watch = Watch(ctx, sink_group(name), args, usage)
    started_at = time.time()
    child = run_child(
        command,
        env=ctx.child_env(),
        log=folder / LOG,
        done=watch,
        timeout_s=args.start_timeout + watch.feed_s + drain_deadline(args) + 600,
        cpus=ctx.taskset,
        usage=usage,
    )
    if child.returncode not in (0, -15, 143):
        raise child.failure(SYSTEM, folder / LOG)
    if watch.started is None or watch.fed_at is None:
        raise child.failure(SYSTEM, folder / LOG, "ended before producing ended")
    text = (folder / LOG).read_text(errors="replace")
    tables = variant.table_names()
    drained = watch.drained_at is not None
    print("counting every row by its seq ...", flush=True)
    exact = count_rows(catalog, tables, watch.produced[0], qualified=True) if drained else None
    history = cadence.histories(catalog, tables)
    window = (args.warm_up, watch.fed_at - watch.started)
    return WideAppResult(
        tables=args.tables,
        rate=args.rate,
        commit_interval_s=args.commit_interval,
        trigger_interval=args.trigger_interval,
        rounds=args.rounds,
        warm_up_s=args.warm_up,
        cores=args.cores,
        create_tables_s=round(create_tables_s, 1),
        start_s=round(watch.started - watch.launched, 1),
        produced=watch.produced[0],
        feed_s=round(watch.fed_at - watch.started, 1),
        drain_s=round(watch.drained_at - watch.fed_at, 1) if watch.drained_at is not None else None,
        cpu_s=round(child.cpu_s, 1),
        broker_cpu_s=None if watch.broker_cpu_s is None else round(watch.broker_cpu_s, 1),
        harness_cpu_s=round(watch.harness_cpu_s, 1),
        peak_rss_mb=round(child.peak_rss_mb),
        partition_groups=ours.partition_groups(text),
        batches=ours.timed_batches(text),
        commit_jobs=ours.commit_jobs(text),
        rounds_seen=commit_rounds(cadence.commit_stamps(history), started_at),
        samples=watch.samples,
        exact=exact,
        cadence=cadence.facts(history, shape, args.cold_commit_interval, watch.started_at, window),
        round_lines=cadence.round_lines(text),
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(result: WideAppResult) -> str:
    """What the run showed, as markdown for docs/benchmarks/wide-sinks.md."""
    spans = [r.span_s for r in result.steady_rounds()]
    batches = [b for b in result.batches if b[1] > 0]
    judged = result.judged()
    growth = result.lag_growth()
    verdict = {True: "yes", False: "**no**", None: "-"}
    groups, bound = result.partition_groups, TASKS_PER_CORE * result.cores
    per_table = result.round_records / result.tables
    drain = "not drained" if result.drain_s is None else f"{result.drain_s:.0f} s"
    jobs = ", ".join(f"{n} / {s:.1f}" for n, s in result.commit_jobs[:12])
    over = sum(1 for s in spans if s > result.commit_interval_s)
    lines = [
        f"`{result.command}`",
        "",
        "| what | figure |",
        "|---|---|",
        f"| tables = partitions | {result.tables:,} |",
        f"| rate, commit interval, trigger | {result.rate:,.0f} records/s, {result.commit_interval_s:g} s, "
        f"{result.trigger_interval} ({per_table:,.0f} records per table and round) |",
        f"| tables created, app start | {result.create_tables_s:.0f} s, {result.start_s:.0f} s |",
        f"| produced | {result.produced:,} in {result.feed_s:.0f} s; drained {drain} after |",
        f"| partition groups (Spark tasks per batch at most) | {groups} (at most {bound}: "
        f"{verdict[None if groups is None else groups <= bound]}) |",
        f"| record batches | {len(batches)}; seconds median {_median([b[2] for b in batches]):.1f}, "
        f"max {max((b[2] for b in batches), default=0):.1f}; records median "
        f"{_median([b[1] for b in batches]):,.0f} |",
        f"| commit rounds of >= 90 % of the tables | {len(spans)}; their table commits span median "
        f"{_median(spans):.1f} s, max {max(spans, default=0):.1f} s; over the interval: {over} |",
        f"| commit jobs (tables / s) | {jobs} |",
        f"| visible lag, judged samples | {len(judged)}; max {max((s.unseen for s in judged), default=0):,}; "
        f"grew by {'-' if growth is None else f'{growth:,.0f}'} (a round: {result.round_records:,.0f}); "
        f"steady: {verdict[result.lag_steady()]} |",
        f"| group lag max, judged | {max((s.group_lag for s in judged), default=0):,} |",
        f"| CPU s: the app's tree, the broker, this harness; the tree's peak RSS | {result.cpu_s:,.0f}, "
        f"{'-' if result.broker_cpu_s is None else f'{result.broker_cpu_s:,.0f}'}, "
        f"{result.harness_cpu_s:,.0f}; {result.peak_rss_mb:,.0f} MB |",
        f"| rows | {result.exact if result.exact is not None else 'not counted (not drained)'} |",
    ]
    if result.cadence is not None:
        lines += cadence.report(result.cadence, result.commit_interval_s, result.round_lines)
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=500, help="tables, and the topic's partitions")
    parser.add_argument("--rounds", type=int, default=10, help="commit intervals judged")
    parser.add_argument("--commit-interval", type=float, default=60.0, help="seconds")
    parser.add_argument("--trigger-interval", default="60s", help="the app's micro-batch interval")
    parser.add_argument("--rate", type=float, default=2_000.0, help="records produced per second")
    parser.add_argument("--warm-up", type=float, default=120.0, help="seconds of producing not judged")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="local[N]")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=10_000_000)
    parser.add_argument("--sample-interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument(
        "--drain-deadline",
        type=float,
        help="seconds after producing ends (default 600, 2 cold intervals at least)",
    )
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the app to start")
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--broker-pid", type=int, help="whose CPU to report (default: the stack's broker)")
    parser.add_argument("--taskset", help="CPUs to pin the app's tree to, taskset -c syntax")
    parser.add_argument("--work-dir", type=Path, help="the run's folder, kept (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="a JSON file the figures are added to, keyed by --label")
    parser.add_argument("--label", help="this run's key in --out (default: the tables)")
    parser.add_argument(
        "--hot-share", type=float, default=0.0, help="share of the tables that are hot (0: alike)"
    )
    parser.add_argument(
        "--hot-records", type=float, default=0.9, help="share of the records the hot tables get"
    )
    parser.add_argument(
        "--cold-commit-interval", type=float, help="seconds: dynamic.commit-interval, every table but the hot"
    )
    parser.add_argument(
        "--compare-with", help="a label in --out: print this run against it (the cadence target)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.compare_with is not None:
        runs = json.loads(args.out.read_text()) if args.out is not None and args.out.exists() else {}
        if args.compare_with not in runs:
            raise SystemExit(
                f"--compare-with {args.compare_with}: no such run in --out {args.out}; run it first"
            )
    stack = daemon.default_dir()
    broker = load_state(stack) if args.bootstrap_servers else daemon.up(stack)[0]
    bootstrap = args.bootstrap_servers or (broker.bootstrap_servers if broker is not None else "")
    if args.broker_pid is None and broker is not None and broker.bootstrap_servers == bootstrap:
        args.broker_pid = broker.pid
    with tempfile.TemporaryDirectory(prefix="wide-app-") as scratch:
        folder = args.work_dir or Path(scratch) / "run"
        result = run(args, bootstrap, folder)
    result.facts = machine_facts()
    result.command = "PYTHONPATH=tests python -m bench.wide_app " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    print(report(result))
    if args.out is not None:
        runs = json.loads(args.out.read_text()) if args.out.exists() else {}
        runs[args.label or str(args.tables)] = result.to_json()
        args.out.write_text(json.dumps(runs, indent=2) + "\n")
        if args.compare_with is not None:
            print(cadence.compare(runs[args.compare_with], runs[args.label or str(args.tables)]))
    return 0 if result.exact is not None and result.exact.exact else 1


if __name__ == "__main__":
    sys.exit(main())
