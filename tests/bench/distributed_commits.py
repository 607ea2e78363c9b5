"""Commit throughput (tables committed per second) on the driver, on one executor and on two, in one run.

``PYTHONPATH=tests python -m bench.distributed_commits --tables 500 --rounds 3 --bootstrap-servers HOST:PORT``

The wide sink of :mod:`bench.wide_sink` (N tables, each fed every round, real workers and a real
``Coordinator.commit_round``) with one Spark session of two single-core executors
(``local-cluster[2,1,1024]``; ``--master`` for another). Each round's table commits run one way
in turn: ``driver`` (the coordinator's own threads), ``1 executor`` (one Spark task commits every
table) and ``2 executors`` (two tasks, one per executor, each half of the tables), through the app's
:class:`~fanout_sink.spark.executor_commits.SparkTableCommits`. Measured per round: the wall seconds of
the table commits alone (from the round's hand-over to the runner until every outcome is back), so
tables per second = tables / those seconds. The executors' Python workers are warmed first (imports,
catalog), and a first round per way is not counted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.process_cpu import read_stat
from bench.wide_sink import WidePlan, WideSink
from fanout_sink.protocol.commit_runners import RoundTables, TableCommitRunner
from fanout_sink.protocol.table_commit import TableCommit
from fanout_sink.spark.executor_commits import SparkTableCommits, commit_table_shares, spark_conf
from fanout_sink.spark.executor_context import TaskSetup
from fanout_sink.spark.session import build_spark_session

WAYS = ("driver", "1 executor", "2 executors")


@dataclass
class TimedRunner:
    """A runner whose rounds are timed: wall seconds, tables, and the driver's CPU seconds of the last
    round, its Python process (the coordinator) and its JVM (Spark's scheduling) apart."""

    runner: TableCommitRunner
    jvm_pid: int
    seconds: float = 0.0
    tables: int = 0
    python_cpu_s: float = 0.0
    jvm_cpu_s: float = 0.0

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        started, python_cpu, jvm_cpu = time.perf_counter(), time.process_time(), _cpu_s(self.jvm_pid)
        results = self.runner(tables)
        self.seconds = time.perf_counter() - started
        self.python_cpu_s = time.process_time() - python_cpu
        self.jvm_cpu_s = _cpu_s(self.jvm_pid) - jvm_cpu
        self.tables = len(tables.due)
        return results


def _cpu_s(pid: int) -> float:
    stat = read_stat(pid)
    if stat is None:
        raise RuntimeError(f"the driver JVM (pid {pid}) is gone")
    return stat.cpu_s


@dataclass(frozen=True)
class CommitRound:
    way: str
    tables: int
    seconds: float
    python_cpu_ms_per_table: float
    """The driver's Python process (the coordinator, and with the driver way its commit threads)."""
    jvm_cpu_ms_per_table: float
    """The driver's JVM (with ``local-cluster``, also the master's and workers' daemons, not the
    executors, which are processes of their own)."""

    @property
    def tables_per_s(self) -> float:
        return self.tables / max(self.seconds, 1e-6)


@dataclass
class CommitThroughput:
    plan: WidePlan
    master: str
    load: tuple[float, float, float]
    rounds: list[CommitRound] = field(default_factory=list)

    def median(self, way: str) -> float:
        return statistics.median(r.tables_per_s for r in self.rounds if r.way == way)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "master": self.master,
            "load": self.load,
            "rounds": [{**asdict(r), "tables_per_s": round(r.tables_per_s, 1)} for r in self.rounds],
        }


def _runners(wide: WideSink, context: Any) -> dict[str, TableCommitRunner]:
    driver = wide.coordinator.table_commits

    session: Future[Any] = Future()
    session.set_result(context)

    def on_executors(shares: int) -> SparkTableCommits:
        return SparkTableCommits(
            session, TaskSetup.of(wide.config, wide.channel), driver, min_tables=1, shares=shares
        )

    return {"driver": driver, "1 executor": on_executors(1), "2 executors": on_executors(2)}


def _warm(context: Any, wide: WideSink) -> None:
    """Wait for the executors and have each Python worker build its committer (imports, catalog):
    one task per executor over an empty round."""
    empty = RoundTables({}, 0, "warm-up", None, deadline=0.0)
    shares = max(2, context.defaultParallelism)
    task = functools.partial(commit_table_shares, TaskSetup.of(wide.config, wide.channel), 1)
    context.parallelize([empty] * shares, numSlices=shares).mapPartitions(task).collect()


def run(plan: WidePlan, bootstrap: str, folder: Path, master: str, parallel: int = 2) -> CommitThroughput:
    result = CommitThroughput(plan, master, os.getloadavg())
    wide = WideSink(plan, bootstrap, folder, parallel)
    spark = build_spark_session(master=master, app_name="distributed-commits", extra_conf=spark_conf())
    try:
        runners = _runners(wide, spark.sparkContext)
        jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        timed = TimedRunner(runners["driver"], jvm_pid)
        wide.coordinator.table_commits = timed
        _warm(spark.sparkContext, wide)
        # A warm-up round on each way first, then the ways in turn, round after round.
        for way, counted in [
            *[(w, False) for w in WAYS],
            *[(w, True) for _ in range(plan.rounds) for w in WAYS],
        ]:
            timed.runner = runners[way]
            wide.round()
            per_table = 1000 / max(1, timed.tables)
            done = CommitRound(
                way,
                timed.tables,
                round(timed.seconds, 3),
                round(timed.python_cpu_s * per_table, 2),
                round(timed.jvm_cpu_s * per_table, 2),
            )
            if counted:
                result.rounds.append(done)
            print(
                f"{way}: {done.tables} tables in {done.seconds:.2f} s, {done.tables_per_s:.0f} tables/s, "
                f"driver CPU per table {done.python_cpu_ms_per_table:.1f} ms Python + "
                f"{done.jvm_cpu_ms_per_table:.1f} ms JVM" + ("" if counted else " (warm-up)"),
                flush=True,
            )
    finally:
        wide.close()
        spark.stop()
    return result


def report(result: CommitThroughput) -> str:
    """The result as a markdown section: one row per way, each round's tables per second."""
    plan = result.plan
    lines = [
        f"### {plan.tables} tables per round, {result.master} (load average at start {result.load[0]:.1f})",
        "",
        "| commits on | tables per second, each round | median | vs driver "
        "| driver CPU ms per table: Python (coordinator) + JVM, medians |",
        "|---|---|---:|---:|---|",
    ]
    driver = result.median("driver")
    for way in WAYS:
        rounds = [r for r in result.rounds if r.way == way]
        rates = " / ".join(f"{r.tables_per_s:.0f}" for r in rounds)
        median = result.median(way)
        python_ms = statistics.median(r.python_cpu_ms_per_table for r in rounds)
        jvm_ms = statistics.median(r.jvm_cpu_ms_per_table for r in rounds)
        lines.append(
            f"| {way} | {rates} | {median:.0f} | {median / driver:.2f}x | {python_ms:.1f} + {jvm_ms:.1f} |"
        )
    ratio = result.median("2 executors") / result.median("1 executor")
    lines += ["", f"Two executors against one: {ratio:.2f}x (target 1.7x)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--records", type=int, default=20, help="per table and round")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per way")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the figures")
    args = parser.parse_args(argv)
    plan = WidePlan(tables=args.tables, partitions=args.tables, records=args.records, rounds=args.rounds)
    with tempfile.TemporaryDirectory(prefix="distributed-commits-") as scratch:
        result = run(plan, args.bootstrap_servers, args.work_dir or Path(scratch), args.master)
    text = report(result)
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
