"""What a wide sink costs per commit round: N tables fed from N source partitions.

``PYTHONPATH=tests python -m bench.wide_sink --tables 500 --rounds 3 --bootstrap-servers HOST:PORT``

The sink routes dynamically by the records' ``t`` field (``dynamic.table``, no per-table rules), to
tables created up front in a fresh SQLite SQL catalog; partition ``p``'s records go to
``--tables-per-slice`` tables starting at ``p``, so every table receives data in every round. Each
round, every partition's slice is delivered by a real :class:`SliceWorker` (``--parallel`` at once,
one slot per parallel task as Spark's Python workers are), then one real
``Coordinator.commit_round`` appends every table's files. Per round it measures the coordinator's
round time and process CPU time per table committed, the catalog calls of the coordinator and of
the workers (counted, by method), the control-topic bytes the round added (workers'
``DataWritten``/``DataComplete`` and the coordinator's events), and the workers' seconds per table
per slice. The first round is reported but kept out of the steady figures: it loads every table
into the workers' caches.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import TopicPartition

from bench.catalog_calls import CatalogCalls
from bench.context import catalog_settings
from bench.hour_ingest import SCHEMA, Slot, create_topic
from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol.channel import CONTROL_PARTITION, SinkChannel
from fanout_sink.protocol.commit_runners import ThreadedCommits
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice
from fanout_sink.protocol.table_commit import StagedCommit, TableCommit, TableCommitter, TablePart

_T = TypeVar("_T")
NAMESPACE = "wide"
COMMIT_INTERVAL_S = 10.0
"""The target: a round of a sink whose every table received data finishes within this."""


@dataclass(frozen=True)
class WidePlan:
    tables: int = 50
    partitions: int = 50
    records: int = 20
    """Records per partition and round."""
    tables_per_slice: int = 1
    rounds: int = 3

    def table_of(self, partition: int, n: int) -> str:
        return f"w{(partition + n % self.tables_per_slice) % self.tables:05d}"

    def table_names(self) -> list[str]:
        return [f"{NAMESPACE}.w{t:05d}" for t in range(self.tables)]


@dataclass
class RoundFigures:
    """One round: the workers' slices, then the coordinator's round."""

    round: int
    records: int
    slices: int
    tables_committed: int
    slice_s: float
    worker_s_per_table_slice: float
    coordinator_round_s: float
    coordinator_cpu_ms_per_table: float
    """The process's CPU time over ``commit_round`` per table committed: what a round costs the
    driver's cores, not the wall clock a shared machine blurs. It includes the idle wake-ups of the
    workers' librdkafka threads (a producer per source partition), so it is an upper bound."""
    commit_thread_cpu_ms_per_table: float
    """The CPU time of the threads that ran the round (``commit_round``'s own and each table
    commit's), per table committed: the coordinator's work alone."""
    coordinator_catalog_calls: dict[str, int]
    worker_catalog_calls: dict[str, int]
    control_bytes: int
    control_messages: int

    @property
    def within_interval(self) -> bool:
        return self.coordinator_round_s <= COMMIT_INTERVAL_S


class TimedCommitter(TableCommitter):
    """The coordinator's table committer, adding up the CPU time of the threads its commits ran on."""

    def __init__(self, committer: TableCommitter, profile: cProfile.Profile | None = None) -> None:
        super().__init__(committer.sink, committer.catalog)
        self.cpu_s = 0.0
        self._lock = threading.Lock()
        self.profile = profile
        """Set only with one commit thread: a profile (of thread CPU) covers the thread enabling it."""

    def commit(self, *args: Any, **kwargs: Any) -> TableCommit:
        return self._timed(super().commit, *args, **kwargs)

    def stage(self, part: TablePart) -> TableCommit | StagedCommit:
        """A table's commit staged for a group (``commit_runners``): the same CPU, timed the same way."""
        return self._timed(super().stage, part)

    def _timed(self, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        started = time.thread_time()
        if self.profile is not None:
            self.profile.enable()
        try:
            return call(*args, **kwargs)
        finally:
            if self.profile is not None:
                self.profile.disable()
            with self._lock:
                self.cpu_s += time.thread_time() - started


@dataclass
class WideResult:
    plan: WidePlan
    parallel: int
    load: tuple[float, float, float]
    rounds: list[RoundFigures] = field(default_factory=list)

    def steady(self) -> list[RoundFigures]:
        """The rounds after the first (which fills the workers' table caches)."""
        return self.rounds[1:] or self.rounds

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "parallel": self.parallel,
            "load": self.load,
            "rounds": [asdict(r) for r in self.rounds],
        }


class WideSink:
    """The sink, its tables, topic and counted catalogs; :meth:`round` delivers and commits one round.

    ``feed`` (tests) narrows a round to some tables: only the partitions that route to them get
    records, as a sink whose other tables are idle.
    """

    def __init__(
        self,
        plan: WidePlan,
        bootstrap: str,
        folder: Path,
        parallel: int = 2,
        profile: cProfile.Profile | None = None,
    ) -> None:
        self.plan = plan
        self.parallel = max(1, parallel)
        settings = catalog_settings(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"wide-{plan.tables}-{os.getpid()}-{int(time.time())}"
        self.topic = f"{name}-src"
        create_topic(bootstrap, self.topic, plan.partitions)
        self.config: SinkConfig = parse_config(
            {
                "name": name,
                "kafka": {"bootstrap.servers": bootstrap},
                "source": {"topics": [self.topic], "format": "json"},
                "control": {"topic": f"{name}-control", "commit-interval": f"{COMMIT_INTERVAL_S:g}s"},
                "catalog": settings.model_dump(),
                "dynamic": {"table": f"join('.', ['{NAMESPACE}', t])", "applies-to": "all"},
            },
            "wide-sink benchmark",
        )
        catalog = load_catalog(settings)
        catalog.create_namespace_if_not_exists(NAMESPACE)
        for table in plan.table_names():
            catalog.create_table(table, schema=SCHEMA)
        self.coordinator_catalog = catalog
        self.coordinator_calls = CatalogCalls(catalog)
        # The workers' catalog is their own (as in an executor), counted apart.
        self.worker_catalog = load_catalog(settings)
        self.worker_calls = CatalogCalls(self.worker_catalog)
        self.channel = SinkChannel.from_config(self.config, PartitionGroups())  # a slot per partition
        self.producer = self.channel.clients.producer({"enable.idempotence": True, "linger.ms": 5})
        self.slots = [Slot.open(self.config, self.worker_catalog) for _ in range(self.parallel)]
        coordinated = CoordinatorSettings(source_topics=(self.topic,))
        self.committer = TimedCommitter(TableCommitter(self.channel.sink, catalog), profile)
        self.coordinator = Coordinator(
            self.channel,
            catalog,
            coordinated,
            table_commits=ThreadedCommits(
                self.committer, 1 if profile is not None else coordinated.max_parallel_commits
            ),
        )
        self.coordinator.open()
        self.control = self.channel.clients.consumer(
            {"group.id": f"{name}-bytes", "enable.auto.commit": False, "isolation.level": "read_uncommitted"}
        )
        self.control_position = 0
        self.next_offsets = dict.fromkeys(range(plan.partitions), 0)
        self.rounds = 0

    def _produce(self, partitions: list[int]) -> dict[int, int]:
        ends: dict[int, int] = {}
        first_id = self.rounds * self.plan.partitions * self.plan.records
        now_ms = int(time.time() * 1000)
        for p in partitions:
            for n in range(self.plan.records):
                value = {
                    **{"id": first_id + p * self.plan.records + n, "t": self.plan.table_of(p, n)},
                    **{"session": f"s-{n}", "page": "/", "country": "DE", "amount": 1.5, "ts": now_ms},
                }
                self.producer.produce(self.topic, value=json.dumps(value).encode(), partition=p)
            ends[p] = self.next_offsets[p] + self.plan.records
        if self.producer.flush(60) != 0:
            raise RuntimeError(f"records for {self.topic} still unsent after 60 s")
        return ends

    def _deliver(self, slot: Slot, partition: int, end: int) -> int:
        start = self.next_offsets[partition]
        read = lambda s, e: slot.reader.read(self.topic, partition, s, e)  # noqa: E731
        sliced = slot.worker.commit_slice(Slice(self.topic, partition, start, end), read, slot.processor)
        if not sliced.transaction_committed:
            raise RuntimeError(f"slice {self.topic}[{partition}] [{start}, {end}) was not committed")
        return sliced.records_in

    def _control_bytes(self) -> tuple[int, int]:
        """Bytes and messages the control topic gained since the last call (keys and values)."""
        topic = self.channel.control_topic
        _, high = self.control.get_watermark_offsets(TopicPartition(topic, CONTROL_PARTITION), timeout=30)
        self.control.assign([TopicPartition(topic, CONTROL_PARTITION, self.control_position)])
        size = count = 0
        deadline = time.monotonic() + 60
        while self.control_position < high and time.monotonic() < deadline:
            message = self.control.poll(1.0)
            if message is None or message.error() is not None:
                (position,) = self.control.position([TopicPartition(topic, CONTROL_PARTITION)])
                self.control_position = max(self.control_position, position.offset)
                continue
            size += len(message.value() or b"") + len(message.key() or b"")
            count += 1
            self.control_position = (message.offset() or 0) + 1
        return size, count

    def round(self, feed: set[str] | None = None) -> RoundFigures:
        """One round: produce, deliver every fed partition's slice, commit; its figures."""
        partitions = [
            p for p in range(self.plan.partitions)
            if feed is None or any(f"{NAMESPACE}.{self.plan.table_of(p, n)}" in feed
                                   for n in range(self.plan.tables_per_slice))
        ]  # fmt: skip
        ends = self._produce(partitions)
        self.worker_calls.take()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="slice") as pool:
            # A partition's slices stay in one slot, as Spark's preferred locations keep them.
            slots = [self.slots[p % self.parallel] for p in partitions]
            tasks = [
                pool.submit(self._deliver, s, p, ends[p]) for s, p in zip(slots, partitions, strict=True)
            ]
            records = sum(task.result() for task in tasks)
        slice_s = time.perf_counter() - started
        worker_calls = self.worker_calls.take()
        self.next_offsets.update(ends)
        self.coordinator_calls.take()
        started, cpu, own_cpu, commits_cpu = (
            time.perf_counter(),
            time.process_time(),
            time.thread_time(),
            self.committer.cpu_s,
        )
        committed = self.coordinator.commit_round()
        round_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        threads_cpu_s = time.thread_time() - own_cpu + self.committer.cpu_s - commits_cpu
        failed = [t for t, c in committed.tables.items() if c.outcome != "committed"]
        if failed:
            raise RuntimeError(f"round {self.rounds}: tables {failed[:5]} not committed")
        control_bytes, control_messages = self._control_bytes()
        table_slices = len(partitions) * min(self.plan.tables_per_slice, self.plan.tables)
        self.rounds += 1
        return RoundFigures(
            round=self.rounds,
            records=records,
            slices=len(partitions),
            tables_committed=len(committed.tables),
            slice_s=round(slice_s, 3),
            worker_s_per_table_slice=round(slice_s * self.parallel / max(1, table_slices), 5),
            coordinator_round_s=round(round_s, 3),
            coordinator_cpu_ms_per_table=round(cpu_s * 1000 / max(1, len(committed.tables)), 2),
            commit_thread_cpu_ms_per_table=round(threads_cpu_s * 1000 / max(1, len(committed.tables)), 2),
            coordinator_catalog_calls=dict(sorted(self.coordinator_calls.take().items())),
            worker_catalog_calls=dict(sorted(worker_calls.items())),
            control_bytes=control_bytes,
            control_messages=control_messages,
        )

    def close(self) -> None:
        self.coordinator.close()
        for slot in self.slots:
            slot.close()
        self.control.close()
        self.producer.flush(30)


def run(
    plan: WidePlan, bootstrap: str, folder: Path, parallel: int = 2, profile: cProfile.Profile | None = None
) -> WideResult:
    result = WideResult(plan, parallel, os.getloadavg())
    wide = WideSink(plan, bootstrap, folder, parallel, profile)
    try:
        for _ in range(plan.rounds):
            figures = wide.round()
            result.rounds.append(figures)
            print(
                f"round {figures.round}: {figures.tables_committed} tables, coordinator "
                f"{figures.coordinator_round_s:.2f} s, {figures.coordinator_cpu_ms_per_table:.1f} ms "
                f"process CPU ({figures.commit_thread_cpu_ms_per_table:.1f} ms in its threads) per table, "
                f"{sum(figures.coordinator_catalog_calls.values())} "
                f"catalog calls, {figures.control_bytes:,} control bytes, worker "
                f"{figures.worker_s_per_table_slice * 1000:.1f} ms per table and slice",
                flush=True,
            )
    finally:
        wide.close()
    return result


def _calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in calls.items()) or "none"


def report(result: WideResult) -> str:
    """The result as a markdown section: one row per round."""
    plan = result.plan
    lines = [
        f"### {plan.tables} tables, {plan.partitions} partitions, {plan.records} records per partition "
        f"and round, {plan.tables_per_slice} table(s) per slice, {result.parallel} parallel slices "
        f"(load average at start {result.load[0]:.1f})",
        "",
        "| round | tables committed | coordinator round s | coordinator CPU ms per table: process (its "
        "threads) | coordinator catalog calls | control bytes (messages) | slices s | worker ms per table "
        "and slice | worker catalog calls |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in result.rounds:
        lines.append(
            f"| {r.round} | {r.tables_committed} | {r.coordinator_round_s:.2f} | "
            f"{r.coordinator_cpu_ms_per_table:.1f} ({r.commit_thread_cpu_ms_per_table:.1f}) | "
            f"{_calls(r.coordinator_catalog_calls)} | "
            f"{r.control_bytes:,} ({r.control_messages}) | "
            f"{r.slice_s:.1f} | {r.worker_s_per_table_slice * 1000:.1f} | {_calls(r.worker_catalog_calls)} |"
        )
    steady = result.steady()
    median = statistics.median(r.coordinator_round_s for r in steady)
    cpu = statistics.median(r.coordinator_cpu_ms_per_table for r in steady)
    threads_cpu = statistics.median(r.commit_thread_cpu_ms_per_table for r in steady)
    verdict = "met" if all(r.within_interval for r in steady) else "NOT met"
    lines += [
        "",
        f"Steady rounds: coordinator round median {median:.2f} s, CPU per table median {cpu:.1f} ms "
        f"({threads_cpu:.1f} ms in its threads); "
        f"within the {COMMIT_INTERVAL_S:g} s "
        f"commit interval: {verdict}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=None, help="default: as many as tables")
    parser.add_argument("--records", type=int, default=20, help="per partition and round")
    parser.add_argument("--tables-per-slice", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the figures")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of the table commits' thread CPU here (pstats); commits run on one thread",
    )
    args = parser.parse_args(argv)
    plan = WidePlan(
        tables=args.tables,
        partitions=args.partitions or args.tables,
        records=args.records,
        tables_per_slice=args.tables_per_slice,
        rounds=args.rounds,
    )
    with tempfile.TemporaryDirectory(prefix="wide-sink-") as scratch:
        profile = cProfile.Profile(time.thread_time) if args.profile is not None else None
        result = run(plan, args.bootstrap_servers, args.work_dir or Path(scratch), args.parallel, profile)
    text = report(result)
    print(text)
    if profile is not None:
        profile.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(40)
    if args.out is not None:
        args.out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
