"""Prototype planner for issue 26: a PySpark Python streaming data source in place of Spark's Kafka source.

    PYTHONPATH=tests python -m bench.python_source run --config sink.yaml --available-now
    PYTHONPATH=tests python -m bench.python_source run --config sink.yaml --planner kafka  # the product's

Bench code, not product. The app (:class:`~fanout_sink.spark.app.SinkApp`: coordinator, batches,
stop, final commit) runs unchanged except for the stream that plans the micro-batches:
:class:`~bench.range_source.RangeSource`, whose tasks run the product's task on
their range and return one summary row each. The driver collects those rows instead of starting a
job of its own (:class:`FrameBatchRunner`), so the exactly-once protocol, the sink group and the
coordinator's round trigger are the product's. The source's offsets are written in the Kafka
source's JSON shape (``{topic: {partition: offset}}``) and its first batch's start to ``sources/0/0``
as that source does, so :mod:`fanout_sink.spark.planning` reads the checkpoint as it is, and a
checkpoint written by either planner serves the other.

PySpark 4.1's ``DataSourceStreamReader`` has no read limit (``latestOffset()`` takes no start and no
limit) and a source without admission control runs ``Trigger.AvailableNow`` as ONE batch up to the
offsets seen at the start. So the cap lives in the reader (it remembers the last end it planned) and
``--available-now`` is emulated: the last stable offsets at start are the ``until`` offsets, batches
run back to back, and the app stops after the batch that reaches them.

At the end the driver logs one line with Spark's per-batch planning time (the trigger's duration
without the batch itself) and the driver JVM's peak RSS (``VmHWM``), for either planner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import re
import statistics
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from bench import ours
from bench.context import RunContext, SystemRun
from bench.range_source import SOURCE_NAME, RangeSource, flat, nested
from fanout_sink import logs
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import log_start_offset, source_positions
from fanout_sink.spark import planning
from fanout_sink.spark.app import RunOptions, SinkApp
from fanout_sink.spark.batch import BatchRunner
from fanout_sink.spark.session import connector_jars
from fanout_sink.spark.task import SliceReport

MODULE = "bench.python_source"
SYSTEM = "fanout_sink python-source"
KAFKA_JARS = re.compile(r"kafka|commons-pool2")
"""The jars only Spark's Kafka source needs (it, its client and the client's pool)."""

log = logging.getLogger("fanout_sink.app")


class FrameBatchRunner(BatchRunner):
    """The product's batch (planning from the checkpoint, round trigger, retries, log line), delivered
    by collecting the micro-batch: each row is a task's report. ``on_ends`` is told each batch's ends."""

    on_ends: Callable[[int, dict[tuple[str, int], int]], None] | None = None

    def _run(self, frame: Any, batch_id: int, ranges: planning.PlannedRanges) -> list[SliceReport]:
        rows = sorted(frame.collect(), key=lambda row: (row.topic, row.partition))
        reports: list[SliceReport] = [pickle.loads(row.report) for row in rows]
        if self.on_ends is not None:
            self.on_ends(batch_id, {key: end for key, (_, end) in ranges.items()})
        return reports


class BatchDurations(StreamingQueryListener):  # type: ignore[misc]
    """Spark's durations of every batch (ms by phase), and the app's stop once ``last_batch`` is
    done in Spark's checkpoint too (the progress event comes after ``commits/<id>``)."""

    def __init__(self, app: SinkApp) -> None:
        self.app = app
        self.batches: list[dict[str, int]] = []
        self.last_batch: int | None = None

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if "addBatch" in progress.durationMs:
            self.batches.append(dict(progress.durationMs))
        if self.last_batch is not None and progress.batchId >= self.last_batch:
            self.app.request_stop()

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None

    def summary(self) -> str:
        """Median ms per phase over the batches that ran; planning = the trigger without the batch."""
        if not self.batches:
            return "no batches"
        phases = {"planning": [b.get("triggerExecution", 0) - b.get("addBatch", 0) for b in self.batches]}
        for phase in ("latestOffset", "queryPlanning", "walCommit", "commitOffsets", "addBatch"):
            phases[phase] = [b.get(phase, 0) for b in self.batches]
        medians = ", ".join(f"{name} {statistics.median(values):.0f}" for name, values in phases.items())
        return f"{len(self.batches)} batches, median ms: {medians} (planning max {max(phases['planning'])})"


def resolve(clients: KafkaClientFactory, group: str, starting: str) -> dict[tuple[str, int], int]:
    """``startingOffsets`` JSON (-2 earliest, -1 latest) as offsets, from the broker."""
    spec = flat(json.loads(starting))
    latest = {
        (p.topic, p.partition): p.end for p in source_positions(clients, group, sorted({t for t, _ in spec}))
    }
    return {
        key: log_start_offset(clients, *key) if off == -2 else latest[key] if off == -1 else off
        for key, off in spec.items()
    }


def driver_jvm_peak_mb() -> float | None:
    """Peak RSS (``VmHWM``) of this process's child JVM, the Spark driver; None when none is found."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == str(os.getpid()) and fields.get("Name", "").strip() == "java":
            return int(fields["VmHWM"].split()[0]) / 1024
    return None


class PlannerApp(SinkApp):
    """The sink app with a choice of planner: ``kafka`` (the product's) or ``python``
    (:class:`RangeSource`)."""

    def __init__(
        self, config: SinkConfig, config_path: Path, options: RunOptions, planner: str, available_now: bool
    ) -> None:
        super().__init__(config, options)
        self.planner = planner
        self.available_now = available_now
        self.config_path = config_path
        if planner == "python":
            self.batches = FrameBatchRunner(
                self.tasks, options.batch_retries, self._coordinator_error, self.metrics, self.rounds
            )
        self._until: dict[tuple[str, int], int] | None = None

    def _stream(self, spark: Any, starting: str, limit: int | None) -> Any:
        if self.planner == "kafka":
            return super()._stream(spark, starting, limit)
        channel = self.channel
        start = resolve(channel.clients, channel.sink_group, starting)
        files = planning.open_checkpoint(self.config.checkpoint_location)
        if not files.names("offsets") and files.read("sources", "0", "0") is None:
            # What the Kafka source writes before its first batch: planning reads batch 0's start here.
            root = Path(planning.LocalCheckpoint(self.config.checkpoint_location).root, "sources", "0")
            root.mkdir(parents=True, exist_ok=True)
            (root / "0").write_text("v1\n" + json.dumps(nested(start)))
        options = {"config": str(self.config_path), "starting": json.dumps(nested(start))}
        if limit:
            options["maxOffsetsPerTrigger"] = str(limit)
        if self._until is not None:
            options["until"] = json.dumps(nested(self._until))
            if all(start.get(key, 0) >= end for key, end in self._until.items()):
                self.request_stop()  # nothing to deliver: no batch would ever come to stop after
        spark.dataSource.register(RangeSource)
        return spark.readStream.format(SOURCE_NAME).options(**options).load()

    def _run_query(self, spark: Any, starting: str) -> None:
        durations = BatchDurations(self)
        spark.streams.addListener(durations)
        if self.planner == "python" and self.available_now:
            channel = self.channel
            positions = source_positions(channel.clients, channel.sink_group, sorted(json.loads(starting)))
            until = self._until = {(p.topic, p.partition): p.end for p in positions}

            def reached(batch_id: int, ends: dict[tuple[str, int], int]) -> None:
                if all(ends.get(key, 0) >= end for key, end in until.items()):
                    durations.last_batch = batch_id

            assert isinstance(self.batches, FrameBatchRunner)
            self.batches.on_ends = reached
        try:
            super()._run_query(spark, starting)
        finally:
            jvm = driver_jvm_peak_mb()
            log.info(
                "planner %s: %s; driver JVM peak RSS %s MB",
                self.planner,
                durations.summary(),
                f"{jvm:.0f}" if jvm is not None else "?",
            )


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    logs.configure(config.logging.format, config.logging.level)
    python = args.planner == "python"
    conf: tuple[tuple[str, str], ...] = ()
    if python and not args.keep_kafka_jars:
        jars = connector_jars(config.catalog, config.checkpoint_location)
        kept = [jar for jar in jars if not KAFKA_JARS.search(Path(jar).name)]
        conf = (("spark.jars", ",".join(kept)), ("spark.driver.extraClassPath", os.pathsep.join(kept)))
    options = RunOptions(
        master=args.master,
        # Emulated for the Python planner (see the module's doc): back-to-back batches until `until`.
        available_now=args.available_now and not python,
        trigger_interval=timedelta(milliseconds=1) if args.available_now and python else None,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        spark_conf=conf,
    )
    return PlannerApp(config, Path(args.config), options, args.planner, args.available_now).run()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the sink with the chosen planner")
    run.add_argument("--config", required=True)
    run.add_argument("--master")
    run.add_argument("--available-now", action="store_true")
    run.add_argument("--max-offsets-per-trigger", type=int)
    run.add_argument("--planner", choices=("python", "kafka"), default="python")
    run.add_argument(
        "--keep-kafka-jars",
        action="store_true",
        help="python planner: keep the Kafka source's jars on the JVM's classpath",
    )
    return parser


def run(ctx: RunContext) -> SystemRun:
    """The side-by-side system ``python-source``: ``--available-now`` with the Python planner."""
    return ours.run_app(ctx, SYSTEM, ["--available-now"], continuous=False, module=MODULE)


def main(argv: list[str] | None = None) -> int:
    return _run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
