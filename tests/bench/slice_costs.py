"""What a worker pays per slice at many tables: one process writing a step of N one-table slices, no
broker, no Spark.

    PYTHONPATH=tests python -m bench.slice_costs --tables 1000 --repeat 3 [--profile]

N tables of one schema exist in a fresh SQLite catalog (created up front, not timed), as a sink
routing a whole database's topics by a field (``dynamic.table``) makes them. A step is what one
Spark task of a packed batch runs: one :meth:`SliceWriter.write` of a partition group holding every
partition's slice (``--records`` JSON records each, one table per partition): routing and
conversion, every table's file written and closed, the check of the tables' uuids before the
transaction, the ``DataWritten`` events. The transaction itself and the range reading are not here
(no broker). Between steps a coordinator commits every table's files as a round does (its own
catalog; not timed), so the tables' metadata pointers move and their snapshots grow as in the app.

Two kinds of step are measured, alternating, ``--repeat`` times each: *cached*, the worker's table
cache fresh; *expired*, the step after the cache's entries passed their age (300 s; the clock the
cache reads is shifted, nothing sleeps), where the worker reloads what it serves. Per slice it
reports the step's process CPU and wall time (best of the repeats: the machine may be shared), and
with ``--profile`` the cumulative time of the named costs and cProfile's top entries for one step
of each kind.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.raw_slices import make_raw_slice

from bench.context import catalog_settings
from bench.hour_ingest import SCHEMA
from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slice_writer import SliceInput, SliceWriter
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.table_commit import TableCommitter
from fanout_sink.transform import tables as table_cache
from fanout_sink.transform.processor import RoutingProcessor

NAMESPACE = "wide"
TOPIC = "db"
CACHE_AGE_S = 300.0
"""The worker's table cache entry age (``TableManager.max_age_seconds``' default)."""
NAMED_COSTS = {
    "JSON decoding (JsonDecoder)": ("json.py", "__call__"),
    "JSON parsed together (ParsedTogether.prepare)": ("json_together.py", "prepare"),
    "routing + conversion (processor)": ("processor.py", "__call__"),
    "table loads (TableManager)": ("tables.py", "ensure"),
    "files: rolling + close (RollingFiles.finish)": ("rolling_files.py", "finish"),
    "file close: fsync (durable_io.fsync_path)": ("durable_io.py", "fsync_path"),
    "uuid check before the transaction": ("slice_writer.py", "_changed_tables"),
    "events (SliceWriter._announce)": ("slice_writer.py", "_announce"),
}
"""Named costs of a step: (file name, function) whose cumulative time the profile reports."""


class _ShiftedClock:
    """The ``time`` module as the table cache sees it, with ``monotonic`` shifted by ``offset``: the
    cache's entries age without waiting."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@dataclass
class StepFigures:
    kind: str
    slices: int
    cpu_s: float
    wall_s: float
    catalog_loads: int

    @property
    def cpu_ms_per_slice(self) -> float:
        return 1000 * self.cpu_s / self.slices

    @property
    def wall_ms_per_slice(self) -> float:
        return 1000 * self.wall_s / self.slices


@dataclass
class Bench:
    tables: int
    records: int
    folder: Path
    clock: _ShiftedClock = field(default_factory=_ShiftedClock)
    step: int = 0
    loads: int = 0

    def __post_init__(self) -> None:
        settings = catalog_settings(self.folder)
        self.sink = f"slices-{os.getpid()}"
        self.config = parse_config(
            {
                "name": self.sink,
                "kafka": {"bootstrap.servers": "localhost:1"},  # never contacted
                "source": {"topics": [TOPIC], "format": "json"},
                "catalog": settings.model_dump(),
                "dynamic": {"table": f"join('.', ['{NAMESPACE}', t])", "applies-to": "all"},
            },
            "slice-costs benchmark",
        )
        coordinator_catalog = load_catalog(settings)
        coordinator_catalog.create_namespace_if_not_exists(NAMESPACE)
        for t in range(self.tables):
            coordinator_catalog.create_table(f"{NAMESPACE}.t{t:05d}", schema=SCHEMA)
        self.committer = TableCommitter(self.sink, coordinator_catalog)
        worker_catalog = load_catalog(settings)  # the worker's own, as in an executor
        load_table = worker_catalog.load_table

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.loads += 1
            return load_table(*args, **kwargs)

        worker_catalog.load_table = counted  # type: ignore[method-assign]
        self.processor = RoutingProcessor(self.config, worker_catalog)
        channel = SinkChannel.from_config(self.config, PartitionGroups())
        self.writer = SliceWriter(channel)
        self.writer._control_max_bytes = 1024 * 1024  # the broker's default; no broker is asked
        setattr(table_cache, "time", self.clock)  # noqa: B010 - the cache's clock, shifted by steps

    def _parts(self) -> list[SliceInput]:
        now_ms = int(time.time() * 1000)
        start = self.step * self.records
        parts = []
        for t in range(self.tables):
            row = {"t": f"t{t:05d}", "page": "/", "country": "DE", "amount": 1.5, "ts": now_ms}
            ids = range(start, start + self.records)
            values = [json.dumps({"id": i, "session": f"s-{i % 7}", **row}).encode() for i in ids]
            raw = make_raw_slice(values, topic=TOPIC, partition=t, start_offset=start)
            planned = Slice(TOPIC, t, start, start + self.records)
            parts.append(SliceInput(planned, raw, None, SliceResult(planned, None)))
        return parts

    def run_step(self, kind: str, profile: cProfile.Profile | None = None) -> StepFigures:
        """One step of ``kind`` (``cached`` or ``expired``), then the coordinator's round."""
        if kind == "expired":
            self.clock.offset += CACHE_AGE_S + 1
        parts = self._parts()
        self.loads = 0
        cpu, wall = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        written = self.writer.write(parts, self.processor)
        if profile is not None:
            profile.disable()
        figures = StepFigures(
            kind, len(parts), time.process_time() - cpu, time.perf_counter() - wall, self.loads
        )
        self._commit(written.events)
        self.step += 1
        return figures

    def _commit(self, events: list[ev.DataWritten]) -> None:
        """The coordinator's round over the step's files, table by table (not timed)."""
        per_table: dict[str, list[PendingFiles]] = {}
        for offset, event in enumerate(events):
            per_table.setdefault(event.table.identifier, []).append(
                PendingFiles(self.step * len(events) + offset, event)
            )
        round_end = (self.step + 1) * len(events)
        commit_id = str(uuid.uuid4())
        for identifier, items in per_table.items():
            done = self.committer.commit(identifier, items, round_end, commit_id, None, {})
            if done.outcome != "committed":
                raise RuntimeError(f"{identifier}: {done.outcome} {done.error}")


def _named(stats: pstats.Stats) -> dict[str, float]:
    """The cumulative seconds of each of :data:`NAMED_COSTS` in a profile."""
    found = dict.fromkeys(NAMED_COSTS, 0.0)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in table.items():
        for name, (file, wanted) in NAMED_COSTS.items():
            if filename.endswith(os.sep + file) and function == wanted:
                found[name] += cumulative
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--records", type=int, default=30, help="per slice (one table each)")
    parser.add_argument("--repeat", type=int, default=3, help="measured steps of each kind")
    parser.add_argument("--profile", action="store_true", help="cProfile one step of each kind")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slice-costs-", dir=args.work_dir) as scratch:
        started = time.perf_counter()
        bench = Bench(args.tables, args.records, Path(scratch))
        print(f"{args.tables} tables created in {time.perf_counter() - started:.1f} s", flush=True)
        warm = bench.run_step("cached")  # the worker's first loads
        print(f"first step: {warm.cpu_ms_per_slice:.2f} ms CPU per slice, {warm.catalog_loads} loads")
        kinds = ("cached", "expired")
        results: dict[str, list[StepFigures]] = {kind: [] for kind in kinds}
        profiles = {kind: cProfile.Profile() for kind in kinds} if args.profile else {}
        for n in range(args.repeat):
            for kind in kinds:
                figures = bench.run_step(kind, profiles.get(kind) if n == args.repeat - 1 else None)
                results[kind].append(figures)
                print(
                    f"{kind} step: {figures.cpu_ms_per_slice:.2f} ms CPU, {figures.wall_ms_per_slice:.2f} ms "
                    f"wall per slice, {figures.catalog_loads} load_table calls",
                    flush=True,
                )
    print(f"\n{args.tables} tables, {args.records} records per slice, load average {os.getloadavg()[0]:.1f}")
    print("| step | CPU ms per slice (best) | wall ms per slice (best) | load_table calls |")
    print("|---|---:|---:|---:|")
    for kind in kinds:
        best_cpu = min(r.cpu_ms_per_slice for r in results[kind])
        best_wall = min(r.wall_ms_per_slice for r in results[kind])
        print(f"| {kind} | {best_cpu:.2f} | {best_wall:.2f} | {results[kind][-1].catalog_loads} |")
    for kind, profile in profiles.items():
        stats = pstats.Stats(profile)
        total = max(stats.total_tt, 1e-9)  # type: ignore[attr-defined]
        print(f"\nprofile of one {kind} step (cProfile, wall): {total:.2f} s")
        for name, seconds in _named(stats).items():
            share = 100 * seconds / total
            print(f"  {name}: {1000 * seconds / args.tables:.2f} ms per slice ({share:.0f} %)")
        stats.sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
