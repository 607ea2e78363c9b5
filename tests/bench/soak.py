"""The soak mode of the side-by-side benchmark: the continuous sink fed steadily for a long time.

Memory that grows by a few MB per batch, or a lag that creeps up, never shows in a one-minute run.
The continuous app consumes one ``uniform-3``-like topic while a producer sends at a fixed rate (70%
of the measured continuous capacity, as the latency mode derives it, unless ``--rate``) for the
duration. Every ``--sample-interval`` seconds the process tree's RSS (total and its largest process,
from the same ``/proc`` sampler that measures every run) and the sink-managed group's lag (last
stable offsets minus its committed offsets) are noted. At the end the sink drains, stops, and every
landed row is counted by its ``seq``: each produced record exactly once, in the table its route
field names. The first ``--warm-up`` seconds are the warm-up (JVM JIT, Arrow pools, Python
workers); RSS is judged against its first sample after it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import latency, ours
from bench.context import PARTITIONS
from bench.proctree import TreeUsage
from bench.workload import ROUTE_FIELD, Variant, routed_chunks
from fanout_sink.catalog import load_catalog
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol.channel import sink_group

RSS_TOLERANCE = 0.10
"""Issue 26's target: RSS within 10% of its post-warm-up value for the whole soak."""
LAG_INTERVALS = 3
"""Lag is bounded when it never exceeds what is produced in this many commit intervals: the sink
commits once per interval, so a lag of one to two intervals is its rhythm, more is falling behind."""
_TICK_S = 0.005
_POOL = 20_000


@dataclass(frozen=True)
class Sample:
    """One look at the running sink: seconds since producing began, RSS, lag, the machine's load."""

    at_s: float
    rss_mb: float
    largest_mb: float
    lag: int
    load1: float
    by_kind: dict[str, float] = field(default_factory=dict)
    """RSS per process kind (driver JVM, driver Python, Python workers): which one grows."""


@dataclass(frozen=True)
class ExactRows:
    """Every landed row counted by its ``seq`` against ``produced`` records numbered 0..produced-1."""

    produced: int
    rows: int
    duplicates: int
    missing: int
    misrouted: int

    @property
    def exact(self) -> bool:
        return self.rows == self.produced and not (self.duplicates or self.missing or self.misrouted)


def rss_drift(at_s: list[float], rss_mb: list[float]) -> tuple[float, float]:
    """How far RSS strays from its first sample (the largest distance, as a share of it) and its
    least-squares slope in MB per 10 minutes: the one judgement of flat memory (the soak's, and the
    backlog benchmark's while it drains), flat at a deviation within ``RSS_TOLERANCE``."""
    base = rss_mb[0]
    deviation = max(abs(mb - base) for mb in rss_mb) / base
    return deviation, statistics.linear_regression(at_s, rss_mb).slope * 600.0


def analyse(
    samples: list[Sample], warm_up_s: float, duration_s: float, rate: float, commit_interval_s: float
) -> dict[str, Any]:
    """The soak's figures and verdicts from its samples: those from ``warm_up_s`` to ``duration_s``
    are judged (after it the sink drains and stops, and a stopping JVM's RSS says nothing).

    RSS: the first post-warm-up sample is the baseline; the deviation is the largest distance from
    it in %, the slope a least-squares fit in MB per 10 minutes. Lag: max and p99 in records and in
    seconds of production, bounded when its max stays within ``LAG_INTERVALS`` commit intervals.
    """
    judged = [s for s in samples if warm_up_s <= s.at_s <= duration_s and s.rss_mb > 0]
    if len(judged) < 2:
        raise SystemExit(
            f"--soak: {len(judged)} samples after the {warm_up_s:g} s warm-up; "
            "fix: a --duration longer than --warm-up by several --sample-interval"
        )
    base = judged[0].rss_mb
    deviation, slope = rss_drift([s.at_s for s in judged], [s.rss_mb for s in judged])
    lags = np.array([s.lag for s in judged], dtype=np.float64)
    lag_max, lag_p99 = float(lags.max()), float(np.percentile(lags, 99))
    lag_bound = rate * LAG_INTERVALS * commit_interval_s
    return {
        "judged_samples": len(judged),
        "rss_post_warm_up_mb": base,
        "rss_max_mb": max(s.rss_mb for s in judged),
        "rss_max_deviation": deviation,
        "rss_slope_mb_per_10min": slope,
        "largest_process_post_warm_up_mb": judged[0].largest_mb,
        "largest_process_max_mb": max(s.largest_mb for s in judged),
        "lag_max": lag_max,
        "lag_p99": lag_p99,
        "lag_max_s": lag_max / rate,
        "lag_p99_s": lag_p99 / rate,
        "lag_bound": lag_bound,
        "kind_growth_mb": {
            kind: max(s.by_kind.get(kind, 0.0) for s in judged) - judged[0].by_kind.get(kind, 0.0)
            for kind in sorted({kind for s in judged for kind in s.by_kind})
        },
        "load1_mean": statistics.fmean(s.load1 for s in samples),
        "load1_max": max(s.load1 for s in samples),
        "rss_flat": deviation <= RSS_TOLERANCE,
        "lag_bounded": lag_max <= lag_bound,
    }


def count_rows(catalog: Any, tables: list[str], produced: int, qualified: bool = False) -> ExactRows:
    """Read ``seq`` and the route field of every data file of every table, one file at a time (a soak
    lands tens of millions of rows: a flag per record, never the rows themselves, stays in memory).
    ``qualified``: the route field holds the whole table name (``workload.routed_chunks``)."""
    seen = np.zeros(produced, dtype=bool)
    rows = duplicates = misrouted = stray = 0
    for name in tables:
        table = catalog.load_table(name)
        route = name if qualified else name.rsplit(".", 1)[1]
        for task in table.scan().plan_files():
            if task.delete_files:
                raise SystemExit(f"--soak: {name} has delete files; the soak's count reads data files only")
            data = pq.read_table(urlparse(task.file.file_path).path, columns=["seq", ROUTE_FIELD])
            seqs = data["seq"].to_numpy()
            rows += len(seqs)
            misrouted += len(seqs) - pc.sum(pc.equal(data[ROUTE_FIELD], route)).as_py()
            inside = seqs[(seqs >= 0) & (seqs < produced)]
            stray += len(seqs) - len(inside)
            unique = np.unique(inside)
            duplicates += len(inside) - len(unique) + int(seen[unique].sum())
            seen[unique] = True
    return ExactRows(produced, rows, duplicates + stray, int(produced - seen.sum()), misrouted)


def templates(variant: Variant, count: int, qualified: bool = False) -> list[tuple[bytes, bytes]]:
    """(route, everything after ``seq``) of ``count`` generated records: a soak sends tens of thousands
    of records a second from one Python thread on a shared machine, where the generator's JSON
    encoding would be the bottleneck; a record is then one bytes format (see :func:`record`).
    ``qualified`` as in :func:`.workload.routed_chunks`."""
    out = []
    for _, chunk in routed_chunks(variant, count, qualified=qualified):
        for value in chunk:
            out.append((json.loads(value)[ROUTE_FIELD].encode(), value[value.index(b',"session"') :]))
    return out


def record(n: int, template: tuple[bytes, bytes]) -> bytes:
    """Record ``n`` (id ``r-<n>``, ``seq`` n) with the template's route and other fields."""
    return b'{"id":"r-%d","%s":"%s","seq":%d%s' % (n, ROUTE_FIELD.encode(), template[0], n, template[1])


def produce_steadily(
    bootstrap: str,
    topic: str,
    value: Callable[[int], tuple[bytes, int]],
    rate: float,
    duration_s: float,
    produced: list[int],
) -> None:
    """Send records 0, 1, ... at ``rate`` per second for ``duration_s`` seconds, record ``n`` being
    ``value(n)`` (its bytes and partition); ``produced[0]`` counts what was handed to the producer (a
    starved producer sends fewer, and says so)."""
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {"linger.ms": 5, "compression.type": "lz4"}
    )
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < duration_s:
        due = int(elapsed * rate) + 1
        while sent < due:
            data, partition = value(sent)
            try:
                producer.produce(topic, value=data, partition=partition)
            except BufferError:
                producer.poll(0.1)
                break
            sent += 1
        produced[0] = sent
        producer.poll(0)
        time.sleep(_TICK_S)
    if producer.flush(120):
        raise TimeoutError(f"producing to {topic}: messages still undelivered after 120 s")


def group_lag(clients: KafkaClientFactory, group: str, topic: str) -> int:
    return sum(p.end - (p.committed or 0) for p in source_positions(clients, group, [topic]))


def measure(args: argparse.Namespace, bootstrap: str, work: Path, results: Path) -> dict[str, Any]:
    """Run the soak; returns its figures, verdicts, samples and exact-rows count for results.json."""
    variant = args.variants[0]
    capacity = None if args.rate else latency.capacity(results, args.cores, variant.name, "--soak")
    rate = args.rate or capacity * args.load
    total = int(rate * args.duration)
    usage = TreeUsage()
    target = [math.inf]  # the rows that end the run: what was produced, known once producing ends
    running = latency.start_sink(args, bootstrap, "soak", total, work / "soak", usage, lambda: target[0])
    ctx, clients = running.ctx, KafkaClientFactory({"bootstrap.servers": bootstrap})
    output: list[str] = []

    def say(line: str) -> None:
        output.append(line)
        print(line, flush=True)

    say(f"soak: producing at {rate:,.0f} records/s for {args.duration:g} s into {ctx.topic}")
    produced = [0]
    pool = templates(ctx.variant, _POOL)

    def value(n: int) -> tuple[bytes, int]:
        return record(n, pool[n % _POOL]), n % PARTITIONS

    producer = threading.Thread(
        target=produce_steadily,
        args=(bootstrap, ctx.topic, value, rate, args.duration, produced),
        name="soak-producer",
        daemon=True,
    )
    started = time.monotonic()
    producer.start()
    samples: list[Sample] = []
    group = sink_group(ours.sink_name(ctx))
    while running.thread.is_alive():
        if not producer.is_alive():
            target[0] = produced[0]
        at = time.monotonic() - started
        sample = Sample(
            at,
            usage.rss_mb,
            usage.largest_rss_mb,
            group_lag(clients, group, ctx.topic),
            os.getloadavg()[0],
            dict(usage.role_now_mb),
        )
        samples.append(sample)
        say(
            f"  {at:6.0f} s: RSS {sample.rss_mb:,.0f} MB (largest {sample.largest_mb:,.0f}), "
            f"lag {sample.lag:,}, produced {produced[0]:,}, load {sample.load1:.2f}"
        )
        running.thread.join(max(0.0, args.sample_interval - (time.monotonic() - started - at)))
    producer.join()
    production_s = time.monotonic() - started
    run = running.result()  # also drops the topic: a soak's is gigabytes
    count = count_rows(load_catalog(ctx.settings), variant.table_names(), produced[0])
    achieved = produced[0] / args.duration
    figures = analyse(samples, args.warm_up, args.duration, achieved, args.commit_interval)
    say(f"soak: {count}; figures {figures}")
    return {
        "variant": variant.name,
        "rate": rate,
        "achieved_rate": achieved,
        "load": None if args.rate else args.load,
        "capacity": capacity,
        "duration_s": args.duration,
        "warm_up_s": args.warm_up,
        "commit_interval_s": args.commit_interval,
        "taskset": args.taskset,
        "records": produced[0],
        "drained_s": production_s,
        "cpu_s": run.cpu_s,
        "rows": asdict(count),
        "exact": count.exact,
        **figures,
        "samples": [asdict(s) for s in samples],
        "output": output,
    }


def _kinds(mb: dict[str, float], signed: bool = False) -> str:
    return ", ".join(
        f"{kind} {value:+,.0f}" if signed else f"{kind} {value:,.0f}" for kind, value in mb.items()
    )


def markdown(soak: dict[str, Any]) -> str:
    """``docs/benchmarks/soak.md``: the command, the verdicts, the figures, the series per minute."""
    rows = soak["rows"]
    verdict = {True: "met", False: "**missed**"}
    per_minute: dict[int, dict[str, Any]] = {}
    for sample in soak["samples"]:
        per_minute.setdefault(int(sample["at_s"] // 60), sample)
    return "\n".join(
        [
            "# Soak: the continuous sink for a long run at a steady rate",
            "",
            "Regenerated by (output below):",
            "",
            f"    {soak['command']}",
            "",
            f"`{soak['variant']}` records at {soak['rate']:,.0f} records/s"
            + (
                f" ({soak['load']:.0%} of the measured capacity {soak['capacity']:,.0f})"
                if soak["load"]
                else ""
            )
            + f" for {soak['duration_s']:g} s: {soak['records']:,} records produced "
            f"({soak['achieved_rate']:,.0f} records/s achieved); commit interval "
            f"{soak['commit_interval_s']:g} s, warm-up {soak['warm_up_s']:g} s, pinned to CPUs "
            f"{soak['taskset'] or 'none (all)'}. Load average (1 min) during the run: mean "
            f"{soak['load1_mean']:.2f}, max {soak['load1_max']:.2f} on {os.cpu_count()} cores (other work "
            "shared the machine when it is above ~2).",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| RSS of the tree within {RSS_TOLERANCE:.0%} of its post-warm-up value | "
            f"{soak['rss_post_warm_up_mb']:,.0f} MB after warm-up, max {soak['rss_max_mb']:,.0f} MB, "
            f"max deviation {soak['rss_max_deviation']:.1%}, slope {soak['rss_slope_mb_per_10min']:+,.0f} "
            f"MB per 10 min | {verdict[soak['rss_flat']]} |",
            "| 0 duplicates, 0 losses, every row in its table "
            f"| {rows['rows']:,} rows of {rows['produced']:,}: "
            f"{rows['duplicates']} duplicates, {rows['missing']} missing, {rows['misrouted']} misrouted "
            f"| {verdict[soak['exact']]} |",
            f"| lag within {LAG_INTERVALS} commit intervals of production ({soak['lag_bound']:,.0f} records) "
            f"| max {soak['lag_max']:,.0f} ({soak['lag_max_s']:.1f} s), p99 {soak['lag_p99']:,.0f} "
            f"({soak['lag_p99_s']:.1f} s) | {verdict[soak['lag_bounded']]} |",
            "",
            f"Largest single process: {soak['largest_process_post_warm_up_mb']:,.0f} MB after warm-up, max "
            f"{soak['largest_process_max_mb']:,.0f} MB. CPU of the tree: {soak['cpu_s']:,.0f} s "
            f"({soak['cpu_s'] * 1e6 / soak['records']:.1f} s per 1M records). Producing began to "
            f"everything visible: {soak['drained_s']:,.0f} s."
            + (
                " Growth from the post-warm-up sample to the max, per process kind: "
                f"{_kinds(soak['kind_growth_mb'], signed=True)}."
                if soak.get("kind_growth_mb")
                else ""
            ),
            "",
            "## Series (first sample of each minute)",
            "",
            "| minute | RSS tree MB | largest process MB | lag records | load (1 min) | RSS by kind MB |",
            "|---:|---:|---:|---:|---:|---|",
            *[
                f"| {minute} | {s['rss_mb']:,.0f} | {s['largest_mb']:,.0f} | {s['lag']:,} "
                f"| {s['load1']:.2f} | {_kinds(s.get('by_kind') or {})} |"
                for minute, s in sorted(per_minute.items())
            ],
            "",
            "## Output",
            "",
            *[f"    {line}" for line in soak["output"]],
            "",
        ]
    )
