"""Catch-up after downtime (issue 32 item 4): one backlog drained by fanout_sink, then by the Iceberg
Kafka Connect sink.

    PYTHONPATH=tests python -m bench.backlog --records 20000000 --tables 500 --bootstrap-servers HOST:PORT
    PYTHONPATH=tests python -m bench.backlog --records 200000 --tables 50 --systems ours

A sink stopped for a day finds its whole backlog waiting when it starts again. So the records are
all produced first: one topic of ``--partitions`` partitions (round-robin), the side-by-side
benchmark's click-like JSON records (``bench.workload``, made fast from templates as the soak makes
them), each naming its table ``bench.t<k>`` in its ``table`` field, spread over ``--tables`` tables.
Both systems route by that field's value, which is how each routes hundreds of tables: fanout_sink
with ``dynamic.table``, Connect with ``iceberg.tables.dynamic-enabled``; both into the same pre-
created tables (``auto-create`` off for both, so neither infers its own types). Each system then
starts on the full backlog, into a fresh catalog of its own, and runs until every table holds all
its rows (SIGTERM then): fanout_sink as ``fanout-sink run`` in continuous mode with bounded micro-
batches (``--max-offsets-per-trigger``), Connect standalone with the same commit interval.

Measured per system, from its start: when the first table became visible (its first snapshot with
rows, polled through the catalog every second), when the backlog was drained (every table at its
count), CPU seconds and peak RSS of the whole process tree (``bench.proctree``), the tree's RSS
sampled over time (memory stays flat, or grows with the backlog), and its commit rounds read back
from the tables' snapshots (grouped by the commit id both systems write into each snapshot summary:
how long each round's table commits took against the commit interval). fanout_sink's micro-batches
and its commit jobs come from its log. Every row is then checked by its ``seq`` and route field
(``soak.count_rows``: none missing, none twice, each in its record's table) and every table's count
against the records routed to it. Figures merge into ``<out>/backlog.json``; ``<out>/backlog.md`` is
rendered from it below its hand-written part.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import connect_peer, ours
from bench.context import RunContext
from bench.end_to_end import produce_chunks
from bench.landed import VisibleRows
from bench.proctree import TreeUsage, run_child
from bench.side_by_side import machine_facts
from bench.soak import RSS_TOLERANCE, ExactRows, count_rows, record, rss_drift, templates
from bench.workload import Variant
from fanout_sink.devtools.stack import daemon
from fanout_sink.kafka.clients import KafkaClientFactory

FIRST_VISIBLE_TARGET_S = 120.0
"""The issue's target: the first tables visible within 2 minutes of start."""
POLL_S = 1.0
"""How often the catalog is polled for visible rows (the resolution of the first-visible time)."""
MARKER = "<!-- bench.backlog renders everything below this line from backlog.json -->"
OURS = "fanout_sink"
TEMPLATES = 20_000
"""Distinct generated records the backlog is made of (ids and ``seq`` unique; see :func:`produce_backlog`)."""
CHUNK = 100_000


@dataclass(frozen=True)
class Sample:
    """The tree's RSS and the rows visible ``at_s`` seconds after the system started."""

    at_s: float
    rss_mb: float
    rows: int
    tables: int
    by_role: dict[str, float]
    """RSS per process kind (driver JVM, driver Python, Python workers): which one grows."""


class Watch:
    """The ``done`` of :func:`.proctree.run_child`: polls the catalog's visible rows (every
    ``poll_s``, default :data:`POLL_S`), notes when the first table shows rows, samples the tree's RSS every
    ``sample_s``, and holds once every table has all its rows."""

    def __init__(
        self, visible: VisibleRows, expected: dict[str, int], sample_s: float, poll_s: float = POLL_S
    ) -> None:
        self.visible = visible
        self.poll_s = poll_s
        self.expected = expected
        self.sample_s = sample_s
        self.usage = TreeUsage()
        self.samples: list[Sample] = []
        self.first_visible_s: float | None = None
        self.started_at = time.time()
        self.started = time.monotonic()
        self._polled = self._sampled = float("-inf")
        self.rows: dict[str, int] = {}
        """Visible rows per table at the latest poll."""

    def __call__(self) -> bool:
        now = time.monotonic() - self.started
        if now - self._polled >= self.poll_s:
            self._polled = now
            self.poll()
            if self.first_visible_s is None and any(self.rows.values()):
                self.first_visible_s = round(now, 1)
        # A tree not yet measured (RSS 0: the sampler counts a process from its second sample) is no sample.
        if now - self._sampled >= self.sample_s and self.usage.rss_mb > 0:
            self._sampled = now
            tables = sum(1 for rows in self.rows.values() if rows)
            self.samples.append(
                Sample(
                    round(now, 1),
                    round(self.usage.rss_mb),
                    sum(self.rows.values()),
                    tables,
                    {kind: round(mb) for kind, mb in self.usage.role_now_mb.items()},
                )
            )
        return self.drained()

    def poll(self) -> None:
        # The catalog being written or not created yet: the next poll reads it.
        with contextlib.suppress(sqlite3.OperationalError):
            self.rows = self.visible()

    def drained(self) -> bool:
        """Every table holds at least its rows (exactly: :func:`.landed.check_same_rows` afterwards)."""
        return all(self.rows.get(table, 0) >= count for table, count in self.expected.items())


@dataclass(frozen=True)
class CommitRound:
    """One commit round as its snapshots show it: the tables it committed, when the first and the last
    of them was committed (seconds from the system's start)."""

    tables: int
    first_s: float
    last_s: float

    @property
    def span_s(self) -> float:
        return self.last_s - self.first_s


@dataclass(frozen=True)
class TableFacts:
    """What the tables' metadata tells after a run: the commit rounds, files and snapshots per table."""

    rounds: list[CommitRound]
    median_data_files: float
    median_snapshots: float


def table_facts(catalog: Any, tables: list[str], started_at: float) -> TableFacts:
    """The commit rounds of every table's snapshots, grouped by the commit id in each snapshot summary
    (fanout_sink's ``fanout-sink.<sink>.commit-id``, Connect's ``kafka.connect.commit-id``), and each
    table's data files (current snapshot) and snapshots, medians over the tables."""
    stamps: dict[str, list[int]] = {}
    files, snapshots = [], []
    for name in tables:
        table = catalog.load_table(name)
        current = table.current_snapshot()
        files.append(int(current.summary["total-data-files"]) if current and current.summary else 0)
        snapshots.append(len(table.snapshots()))
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            commit = next((v for k, v in summary.items() if k.endswith("commit-id")), None)
            if commit is not None:
                stamps.setdefault(commit, []).append(snapshot.timestamp_ms)
    return TableFacts(
        commit_rounds(stamps, started_at), statistics.median(files), statistics.median(snapshots)
    )


def commit_rounds(stamps: Mapping[str, list[int]], started_at: float) -> list[CommitRound]:
    """The commit rounds of the snapshot times (epoch ms) grouped per commit id, in time order."""
    rounds = [
        CommitRound(len(ms), round(min(ms) / 1000 - started_at, 2), round(max(ms) / 1000 - started_at, 2))
        for ms in stamps.values()
    ]
    return sorted(rounds, key=lambda r: r.first_s)


@dataclass(frozen=True)
class Backlog:
    """The produced backlog: its topic, size and every table's record count."""

    topic: str
    records: int
    megabytes: float
    produce_s: float
    counts: dict[str, int]


def produce_backlog(bootstrap: str, variant: Variant, records: int, partitions: int) -> Backlog:
    """Produce the whole backlog to a new topic before any system starts.

    Record ``n`` is the soak's template ``n % TEMPLATES`` with id ``r-<n>`` and ``seq`` n
    (``soak.record``): encoding 20M records one by one as JSON would take this one Python thread ten
    minutes on the shared machine; the records' other fields repeat every ``TEMPLATES`` records."""
    topic = f"backlog-{variant.tables}-{uuid.uuid4().hex[:6]}"
    pool = templates(variant, min(records, TEMPLATES), qualified=True)
    names = variant.table_names()
    counts = dict.fromkeys(names, 0)
    size = 0

    def chunks() -> Iterator[tuple[None, list[bytes]]]:
        nonlocal size
        for start in range(0, records, CHUNK):
            values = [record(n, pool[n % len(pool)]) for n in range(start, min(records, start + CHUNK))]
            size += sum(len(v) for v in values)
            yield None, values

    for n, (route, _) in enumerate(pool):
        counts[route.decode()] += len(range(n, records, len(pool)))
    produce_s = produce_chunks(bootstrap, topic, chunks(), partitions)
    return Backlog(topic, records, size / 1e6, produce_s, counts)


def _ours(ctx: RunContext) -> list[str]:
    return ours.dynamic_command(ctx, ctx.unique_name(OURS), ours.TRIGGER_INTERVAL)


def _connect(ctx: RunContext) -> list[str]:
    return connect_peer.connector_command(ctx, dynamic=True)


@dataclass(frozen=True)
class System:
    name: str
    command: Callable[[RunContext], list[str]]
    log: str


SYSTEMS = {
    "ours": System(OURS, _ours, "app.log"),
    "connect": System(connect_peer.SYSTEM, _connect, connect_peer.LOG),
}


@dataclass
class SystemFigures:
    """One system's drain of the backlog."""

    system: str
    first_visible_s: float | None
    drain_s: float
    records_per_s: float
    mb_per_s: float
    cpu_s: float
    peak_rss_mb: float
    role_rss_mb: dict[str, float]
    rss_deviation: float | None
    """From the first table visible to the drain: the tree's RSS's largest distance from its first
    sample then, as a share of it (``soak.rss_drift``); flat within ``soak.RSS_TOLERANCE``."""
    rss_slope_mb_per_10min: float | None
    samples: list[Sample]
    rounds: list[CommitRound]
    batches: list[tuple[int, float]]
    """fanout_sink's record-carrying micro-batches: (records, seconds)."""
    commit_jobs: list[tuple[int, float]]
    """fanout_sink's table-commit Spark jobs: (tables, seconds)."""
    exact: ExactRows
    exact_tables: int
    """Tables whose visible row count (snapshot summary) equals the records routed to them."""
    median_data_files: float
    median_snapshots: float
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    returncode: int

    @property
    def memory_flat(self) -> bool | None:
        return None if self.rss_deviation is None else self.rss_deviation <= RSS_TOLERANCE

    def rounds_over(self, interval_s: float) -> int:
        return sum(1 for r in self.rounds if r.span_s > interval_s)


def _drift(samples: list[Sample], start_s: float | None) -> tuple[float | None, float | None]:
    """``soak.rss_drift`` over the samples from ``start_s`` on; None without three of them."""
    judged = [s for s in samples if start_s is not None and s.at_s >= start_s]
    if len(judged) < 3:
        return None, None
    deviation, slope = rss_drift([s.at_s for s in judged], [s.rss_mb for s in judged])
    return round(deviation, 3), round(slope, 1)


def run_system(key: str, ctx: RunContext, backlog: Backlog, sample_s: float) -> SystemFigures:
    """One system from a fresh catalog on the whole backlog, until every table holds its rows; then
    every row is checked (none missing, none twice, each in its record's table)."""
    system = SYSTEMS[key]
    catalog = ctx.prepare()
    command = system.command(ctx)
    tables = ctx.variant.table_names()
    watch = Watch(ctx.visible(), backlog.counts, sample_s)
    load_start = os.getloadavg()
    log = ctx.folder / system.log
    child = run_child(
        command,
        env=ctx.child_env(),
        log=log,
        done=watch,
        timeout_s=ctx.timeout_s,
        cpus=ctx.taskset,
        usage=watch.usage,
    )
    load_end = os.getloadavg()
    watch.poll()
    if not watch.drained():
        raise child.failure(system.name, log, "exited before every row was visible")
    exact = count_rows(catalog, tables, backlog.records, qualified=True)
    exact_tables = sum(1 for t in tables if watch.rows.get(t) == backlog.counts[t])
    if not exact.exact or exact_tables != len(tables):
        raise SystemExit(
            f"{system.name} did not land the backlog exactly: {exact}, {exact_tables}/{len(tables)} tables "
            f"at their count; fix: read its log {log}"
        )
    deviation, slope = _drift(watch.samples, watch.first_visible_s)
    facts = table_facts(catalog, tables, watch.started_at)
    text = log.read_text(errors="replace")
    return SystemFigures(
        system=system.name,
        first_visible_s=watch.first_visible_s,
        drain_s=round(child.wall_s, 1),
        records_per_s=round(backlog.records / child.wall_s),
        mb_per_s=round(backlog.megabytes / child.wall_s, 2),
        cpu_s=round(child.cpu_s, 1),
        peak_rss_mb=round(child.peak_rss_mb),
        role_rss_mb={k: round(v) for k, v in child.role_rss_mb.items()},
        rss_deviation=deviation,
        rss_slope_mb_per_10min=slope,
        samples=watch.samples,
        rounds=facts.rounds,
        batches=[(records, seconds) for _, records, seconds in ours.timed_batches(text)],
        commit_jobs=ours.commit_jobs(text),
        exact=exact,
        exact_tables=exact_tables,
        median_data_files=facts.median_data_files,
        median_snapshots=facts.median_snapshots,
        load_start=load_start,
        load_end=load_end,
        returncode=child.returncode,
    )


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**NOT met**")


def _rss_series(samples: list[dict[str, Any]], points: int = 12) -> str:
    """About ``points`` evenly spaced samples, ``t s: MB``."""
    step = max(1, -(-len(samples) // points))
    picked = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    return ", ".join(f"{s['at_s']:.0f} s: {s['rss_mb']:,.0f}" for s in picked)


def _by_role(samples: list[dict[str, Any]], kind: str) -> str:
    first_visible = next((x for x in samples if x["tables"]), samples[-1])
    picked = (samples[0], first_visible, samples[-1])
    return " -> ".join(f"{x['by_role'].get(kind, 0):,.0f}" for x in picked)


def markdown_run(key: str, run: dict[str, Any]) -> str:
    """One run of backlog.json as a markdown section."""
    interval = run["commit_interval_s"]
    lines = [
        f"### {key}",
        "",
        f"`{run['command']}`",
        "",
        f"{run['records']:,} records ({run['megabytes']:,.0f} MB of JSON values) over {run['tables']} "
        f"tables, one topic of {run['partitions']} partitions, produced in {run['produce_s']:.0f} s before "
        f"either system started; commit interval {interval:g} s; fanout_sink local[{run['cores']}] with "
        f"--max-offsets-per-trigger {run['max_offsets_per_trigger']:,}, Connect tasks.max {run['cores']}.",
        "",
        "| system | first table visible s | drained s | records/s | MB/s | CPU s | peak RSS tree MB "
        "| RSS while draining: largest deviation, slope MB/10 min | commit rounds "
        "| round table-commit span median / max s "
        f"| rounds over {interval:g} s | micro-batches: n, s median / max | commit jobs s median / max "
        "| data files / snapshots per table (median) | exact | load avg start / end |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|---|---|---|---|",
    ]
    for s in run["systems"]:
        rounds = [r["last_s"] - r["first_s"] for r in s["rounds"]]
        batches = [b[1] for b in s["batches"]]
        jobs = [j[1] for j in s["commit_jobs"]]
        drift = (
            "-"
            if s["rss_deviation"] is None
            else f"{s['rss_deviation']:.0%}, {s['rss_slope_mb_per_10min']:+,.0f}"
        )
        first = "never" if s["first_visible_s"] is None else f"{s['first_visible_s']:.0f}"
        lines.append(
            f"| {s['system']} | {first} | {s['drain_s']:.1f} | {s['records_per_s']:,} | "
            f"{s['mb_per_s']:.1f} | {s['cpu_s']:.0f} | {s['peak_rss_mb']:,} | {drift} | {len(rounds)} | "
            f"{_seconds(rounds)} | {sum(1 for r in rounds if r > interval)} | "
            f"{len(batches)}, {_seconds(batches)} | {_seconds(jobs)} | "
            f"{s['median_data_files']:g} / {s['median_snapshots']:g} | "
            f"{s['exact_tables']}/{run['tables']} | {s['load_start'][0]:.1f} / {s['load_end'][0]:.1f} |"
        )
    lines += ["", "| target | " + " | ".join(s["system"] for s in run["systems"]) + " |"]
    lines.append("|---|" + "---|" * len(run["systems"]))
    rows: list[tuple[str, Callable[[dict[str, Any]], bool | None]]] = [
        (
            f"first table visible within {FIRST_VISIBLE_TARGET_S:.0f} s",
            lambda s: s["first_visible_s"] is not None and s["first_visible_s"] <= FIRST_VISIBLE_TARGET_S,
        ),
        (
            f"memory flat (RSS within {RSS_TOLERANCE:.0%} of its value at the first visible table)",
            lambda s: None if s["rss_deviation"] is None else s["rss_deviation"] <= RSS_TOLERANCE,
        ),
        (
            f"every round's table commits within the {interval:g} s interval",
            lambda s: all(r["last_s"] - r["first_s"] <= interval for r in s["rounds"]),
        ),
    ]
    for label, judge in rows:
        lines.append(f"| {label} | " + " | ".join(_verdict(judge(s)) for s in run["systems"]) + " |")
    lines.append("")
    for s in run["systems"]:
        lines.append(f"RSS of the {s['system']} tree over time: {_rss_series(s['samples'])}.")
        if s["samples"] and len(s["samples"][-1]["by_role"]) > 1:  # Connect is one process: its JVM
            kinds = ", ".join(
                f"{kind} {_by_role(s['samples'], kind)}" for kind in sorted(s["samples"][-1]["by_role"])
            )
            lines.append(f"By process kind, first sample -> at the first visible table -> last: {kinds}.")
        lines.append("")
    return "\n".join(lines)


def render_below(path: Path, marker: str, title: str, body: str) -> None:
    """Write ``body`` below ``marker`` in the page ``path``, keeping what is written above it (a new
    page gets ``title``)."""
    head = path.read_text().split(marker)[0] if path.exists() else f"# {title}\n\n"
    path.write_text(f"{head.rstrip()}\n\n{marker}\n\n{body}")


def write_markdown(path: Path, runs: dict[str, Any]) -> None:
    """Render every run below :data:`MARKER`, keeping what is written above it."""
    body = "\n".join(markdown_run(key, run) for key, run in runs.items())
    render_below(path, MARKER, "Catch-up after downtime", body)


def start_systems(
    argv: list[str] | None, module: str, systems: str, known: Iterable[str], bootstrap_servers: str | None
) -> tuple[list[str], str, str]:
    """A side-by-side benchmark's start: its ``--systems`` as keys (each one of ``known``), the broker
    (the local stack's, started when down, unless given) and the command line as run (``module``'s);
    with ``connect`` among them, the peer's jars are fetched before anything is timed."""
    keys = [s.strip() for s in systems.split(",") if s.strip()]
    if unknown := [k for k in keys if k not in known]:
        raise SystemExit(f"--systems: unknown {unknown}; pick from {', '.join(known)}")
    bootstrap = bootstrap_servers or daemon.up(daemon.default_dir())[0].bootstrap_servers
    command = f"PYTHONPATH=tests python -m {module} " + shlex.join(argv if argv is not None else sys.argv[1:])
    if "connect" in keys:
        connect_peer.kafka_version()
        connect_peer.iceberg_version()
    return keys, bootstrap, command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=20_000_000)
    parser.add_argument("--tables", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=8, help="of the backlog's one topic")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated of {', '.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--cores", type=int, default=os.cpu_count() or 2, help="local[N]; Connect's tasks.max"
    )
    parser.add_argument("--commit-interval", type=float, default=10.0, help="seconds, for both systems")
    parser.add_argument(
        "--max-offsets-per-trigger", type=int, default=1_000_000, help="fanout_sink's batches"
    )
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="backlog.json and .md")
    parser.add_argument("--work-dir", type=Path, help="run folders, kept (default: a temporary folder)")
    parser.add_argument("--taskset", help="CPUs to pin each system's tree to, taskset -c syntax")
    parser.add_argument(
        "--connect-heap", default="2g", help="the Connect peer's -Xmx (at 500 tables it ran out of 2g)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keys, bootstrap, command = start_systems(
        argv, "bench.backlog", args.systems, SYSTEMS, args.bootstrap_servers
    )
    variant = Variant("uniform", args.tables)
    backlog = produce_backlog(bootstrap, variant, args.records, args.partitions)
    print(
        f"backlog: {backlog.records:,} records ({backlog.megabytes:,.0f} MB) on {backlog.topic} "
        f"({args.partitions} partitions) in {backlog.produce_s:.0f} s",
        flush=True,
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="backlog-"))
    figures = []
    try:
        for system in keys:
            ctx = RunContext(
                bootstrap=bootstrap,
                topic=backlog.topic,
                variant=variant,
                records=args.records,
                values_file=Path(os.devnull),  # neither system reads the records from a file
                commit_interval_s=args.commit_interval,
                cores=args.cores,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
                folder=work / system,
                taskset=args.taskset,
                connect_heap=args.connect_heap,
            )
            done = run_system(system, ctx, backlog, args.sample_interval)
            figures.append(done)
            print(
                f"{done.system}: first table visible at {done.first_visible_s} s, drained in "
                f"{done.drain_s:.1f} s ({done.records_per_s:,} records/s, {done.mb_per_s:.1f} MB/s), "
                f"{done.cpu_s:.0f} CPU s, peak RSS {done.peak_rss_mb:,} MB, {len(done.rounds)} rounds "
                f"({done.rounds_over(args.commit_interval)} over the interval), memory flat: "
                f"{done.memory_flat}, {done.exact_tables}/{args.tables} tables exact",
                flush=True,
            )
    finally:
        # The topic is this run's only: dropped so repeated runs do not fill the broker's disk.
        admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
        admin.delete_topics([backlog.topic])[backlog.topic].result(timeout=30)
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    run = {
        "command": command,
        "records": args.records,
        "tables": args.tables,
        "partitions": args.partitions,
        "megabytes": round(backlog.megabytes, 1),
        "produce_s": round(backlog.produce_s, 1),
        "commit_interval_s": args.commit_interval,
        "cores": args.cores,
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "machine": machine_facts(),
        "systems": [asdict(f) for f in figures],
    }
    path = args.out / "backlog.json"
    runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    key = f"{args.records:,} records, {args.tables} tables ({', '.join(keys)})"
    runs[key] = run
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=1) + "\n")
    write_markdown(args.out / "backlog.md", runs)
    print(markdown_run(key, run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
