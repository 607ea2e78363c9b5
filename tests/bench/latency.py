"""The latency mode of the side-by-side benchmark: a steady producer, the sink running continuously.

The producer starts once the sink's streaming query runs (start-up is not latency) and sends at a
fixed rate, half the measured continuous capacity unless ``--rate`` says otherwise, noting each
record's produce time. Afterwards every snapshot of every table is walked in commit order; the
ids in the data files a snapshot added become visible at that snapshot's timestamp. Latency is
that timestamp minus the record's produce time.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka.cimpl import NewTopic

from bench import ours, report
from bench.context import PARTITIONS, RunContext, SystemRun
from bench.proctree import TreeUsage
from bench.workload import values
from fanout_sink.catalog import load_catalog
from fanout_sink.kafka.clients import KafkaClientFactory

_STARTED = "streaming query"
_TICK_S = 0.005


def capacity(results: Path, cores: int, variant: str, mode: str = "--latency") -> float:
    """The continuous sink's measured steady records/s for ``variant`` on ``cores`` (unpinned runs, the
    standard size's when several were measured)."""
    data = json.loads(results.read_text()) if results.exists() else {}
    summaries = report.summarise(report.Measurement(**m) for m in data.get("measurements") or [])
    wanted = (cores, variant, report.OURS_CONTINUOUS, None)
    found = [
        s.steady_rate
        for s in sorted(summaries, key=lambda s: s.records != report.STANDARD_RECORDS)
        if (s.cores, s.variant, s.system, s.taskset) == wanted and s.steady_rate
    ]
    if not found:
        raise SystemExit(
            f"{mode}: no continuous steady state measured for {variant} on {cores} cores in {results}; "
            "fix: run the throughput mode with --systems continuous first, or pass --rate"
        )
    return found[0]


def wait_for_query(log: Path, sink: threading.Thread) -> None:
    """Return once the app's log says its streaming query runs (start-up is not what is measured),
    or once the ``sink`` thread has ended (its outcome then tells why)."""
    while not (log.exists() and _STARTED in log.read_text(errors="replace")):
        if not sink.is_alive():
            return
        time.sleep(0.5)


def _produce_steadily(bootstrap: str, topic: str, records: list[bytes], rate: float) -> list[float]:
    """Produce ``records`` at ``rate`` per second; returns each record's produce time (epoch ms)."""
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {"linger.ms": 5, "compression.type": "lz4"}
    )
    produced_ms = [0.0] * len(records)
    started = time.monotonic()
    sent = 0
    while sent < len(records):
        due = min(len(records), int((time.monotonic() - started) * rate) + 1)
        now_ms = time.time() * 1000
        for n in range(sent, due):
            producer.produce(topic, value=records[n], partition=n % PARTITIONS)
            produced_ms[n] = now_ms
        sent = due
        producer.poll(0)
        time.sleep(_TICK_S)
    producer.flush(60)
    return produced_ms


def visible_ms(ctx: RunContext) -> tuple[pa.Array, pa.Array]:
    """(record sequence number, epoch ms of the first snapshot holding it) over every table."""
    catalog = load_catalog(ctx.settings)
    seqs, stamps = [], []
    for name in ctx.variant.table_names():
        table = catalog.load_table(name)
        seen: set[str] = set()
        for snapshot in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
            paths = {
                task.file.file_path for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
            }
            for path in sorted(paths - seen):
                ids = pq.read_table(urlparse(path).path, columns=["id"])["id"]
                seqs.append(pc.cast(pc.utf8_slice_codeunits(ids, 2), pa.int64()))
                stamps.append(pa.array([snapshot.timestamp_ms] * len(ids), pa.float64()))
            seen |= paths
    return pa.chunked_array(seqs, pa.int64()).combine_chunks(), pa.chunked_array(
        stamps, pa.float64()
    ).combine_chunks()


@dataclass
class RunningSink:
    """The continuous app consuming a fresh topic, in a thread: what the latency and soak modes feed."""

    ctx: RunContext
    thread: threading.Thread
    outcome: list[SystemRun | BaseException]
    admin: Any  # held: the topic futures die with the client

    def result(self) -> SystemRun:
        """Wait for the app to have made every record visible and stopped; drop the input topic."""
        self.thread.join()
        self.admin.delete_topics([self.ctx.topic])[self.ctx.topic].result(timeout=30)
        if isinstance(self.outcome[0], BaseException):
            raise self.outcome[0]
        return self.outcome[0]


def start_sink(
    args: argparse.Namespace,
    bootstrap: str,
    mode: str,
    total: int,
    folder: Path,
    usage: TreeUsage | None = None,
    until: Callable[[], float] | None = None,
) -> RunningSink:
    """Create a topic, start the continuous app on it until ``total`` records are visible; return once
    its streaming query runs. ``usage`` is the app's process tree as sampled while it runs; ``until``
    replaces ``total`` as the visible rows that end the run."""
    topic = f"side-by-side-{mode}-{uuid.uuid4().hex[:6]}"
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
    ctx = RunContext(
        bootstrap=bootstrap,
        topic=topic,
        variant=args.variants[0],
        records=total,
        values_file=folder / "unused",
        commit_interval_s=args.commit_interval,
        cores=args.cores,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        folder=folder,
        taskset=args.taskset,
        maintenance=dict(args.maintenance),
    )
    outcome: list[SystemRun | BaseException] = []

    def sink() -> None:
        try:
            outcome.append(ours.continuous(ctx, usage, until))
        except BaseException as exc:  # handed to the main thread
            outcome.append(exc)

    thread = threading.Thread(target=sink, name=f"{mode}-sink", daemon=True)
    thread.start()
    wait_for_query(ctx.folder / "app.log", thread)
    return RunningSink(ctx, thread, outcome, admin)


def measure(args: argparse.Namespace, bootstrap: str, work: Path, results: Path) -> dict[str, Any]:
    variant = args.variants[0]
    rate = args.rate or capacity(results, args.cores, variant.name) / 2
    total = int(rate * args.duration)
    running = start_sink(args, bootstrap, "latency", total, work / "latency")
    ctx, log = running.ctx, running.ctx.folder / "app.log"
    records = values(variant, total)
    print(f"latency: producing {total:,} records at {rate:,.0f}/s into {ctx.topic}", flush=True)
    produced = pa.array(_produce_steadily(bootstrap, ctx.topic, records, rate), pa.float64())
    running.result()
    seqs, stamps = visible_ms(ctx)
    if len(seqs) != total:
        raise SystemExit(f"--latency: {len(seqs):,} rows landed, {total:,} produced; log {log}")
    latencies = pc.divide(pc.subtract(stamps, pc.take(produced, seqs)), 1000.0)
    p50, p99 = pc.quantile(latencies, q=[0.5, 0.99]).to_pylist()
    return {
        "variant": variant.name,
        "records": total,
        "rate": rate,
        "duration_s": args.duration,
        "commit_interval_s": args.commit_interval,
        "p50_s": p50,
        "p99_s": p99,
        "max_s": pc.max(latencies).as_py(),
    }
