"""The Spark Structured Streaming application: Kafka source -> foreachBatch -> workers -> coordinator.

This module owns the run's life cycle only: the sink's own topics, where the stream starts
(:mod:`~fanout_sink.spark.planning`), the Spark session, the streaming query whose batches
:class:`~fanout_sink.spark.batch.BatchRunner` runs, the coordinator thread on the driver, and a stop
on SIGTERM or Ctrl-C that lets the running batch finish and commits before exiting.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from fanout_sink import preflight
from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import RecordError
from fanout_sink.kafka.topics import ensure_topic
from fanout_sink.metrics import SinkMetrics
from fanout_sink.protocol import group_layout
from fanout_sink.protocol.channel import SinkChannel, ensure_control_topic
from fanout_sink.protocol.commit_runners import ThreadedCommits
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings, RoundResult
from fanout_sink.protocol.pacing import step_target_s
from fanout_sink.protocol.round_trigger import RoundTrigger
from fanout_sink.protocol.round_words import tally
from fanout_sink.protocol.table_cadence import CommitIntervals
from fanout_sink.protocol.table_commit import TableCommitter
from fanout_sink.spark import (
    executor_commits,
    footprint,
    maintenance_schedule,
    partition_group_count,
    planning,
    progress,
    worker_warmup,
)
from fanout_sink.spark.batch import BatchRunner, StopRequested
from fanout_sink.spark.executor_context import TaskSetup
from fanout_sink.spark.session import build_spark_session
from fanout_sink.spark.source import read_stream
from fanout_sink.spark.spark_metrics import SparkMetricsMirror

log = logging.getLogger("fanout_sink.app")


def final_round_words(result: RoundResult) -> str:
    """The app's last line about its final round, in words: how many tables it committed (each one is
    named on the round's own ``commit ...`` line just above), never the result's repr (a kilobyte)."""
    if not result.tables:
        return "final commit round: nothing was pending"
    told, files = tally(result.tables)
    return f"final commit round {result.commit_id}: {len(result.tables)} table(s), {told}, {files} file(s)"


@dataclass(frozen=True)
class RunOptions:
    """Command-line overrides of the ``spark`` section."""

    master: str | None = None
    available_now: bool = False
    trigger_interval: timedelta | None = None
    max_offsets_per_trigger: int | None = None
    batch_retries: int = 3
    spark_conf: tuple[tuple[str, str], ...] = ()


class _Prepared(NamedTuple):
    """What the start's broker part found and started (:meth:`SinkApp._prepare`)."""

    partitions: dict[str, int]
    starting: str | None
    """Where the stream starts; None for a checkpoint that only the session's JVM reads."""
    coordinator: Coordinator


class SinkApp:
    """Runs one sink: the streaming query, its batches and the coordinator thread."""

    def __init__(self, config: SinkConfig, options: RunOptions | None = None) -> None:
        self.options = options = options or RunOptions()
        master = options.master or config.spark.master
        self.config = config
        conf = {**config.spark.conf, **dict(options.spark_conf)}
        self.channel = SinkChannel.from_config(
            config, partition_group_count.decide(config, master, conf), group_layout.new_start_id()
        )
        """The run's one channel: planning, the batches' tasks and the coordinator pack alike, and
        the layout is recorded with this start at start for every other process
        (``protocol/group_layout.py``); a later start's record stops this app's attempts."""
        self.metrics = (
            SinkMetrics(
                config.name, config.control.commit_interval.total_seconds(), CommitIntervals.of(config)
            )
            if config.metrics is not None
            else None
        )
        control = config.control
        # Shared by the batches (what each planned) and the coordinator (what was reported).
        self.rounds = RoundTrigger(
            control.commit_interval.total_seconds(), control.commit_min_interval.total_seconds()
        )
        self.tasks = TaskSetup.of(config, self.channel)
        """What every Spark task of the run gets: the batches' and the table commits'."""
        self.batches = BatchRunner(
            self.tasks, self.options.batch_retries, self._coordinator_error, self.metrics, self.rounds
        )
        self._stop_requested = threading.Event()
        self._query_started = threading.Event()
        self._query: Any = None
        self._coordinator: Coordinator | None = None
        self._spark_context: Future[Any] = Future()
        """The session's SparkContext once it exists: the coordinator's executor commits wait for it."""

    def _coordinator_error(self) -> BaseException | None:
        return self._coordinator.error if self._coordinator is not None else None

    @property
    def record_error(self) -> RecordError | None:
        """The bad record that stopped the query (``errors.tolerance: none``), raised by :meth:`run`."""
        return self.batches.record_error

    @property
    def stop_grace_s(self) -> float:
        """How long a stop waits for the running batch before cancelling it: about one step of a
        task (``protocol/pacing.py``), since a batch may hold a whole backlog."""
        return step_target_s(self.config.control.commit_interval.total_seconds())

    def request_stop(self, *_: Any) -> None:
        """SIGTERM / Ctrl-C: let the running batch finish within the grace, else cancel it; then stop
        the query (see ``_stopper``)."""
        log.info(
            "stop requested: finishing the current batch within %.0fs (else cancelling it: Spark "
            "replays it on the next start), then committing",
            self.stop_grace_s,
        )
        self._stop_requested.set()

    def _stopper(self) -> None:
        self._stop_requested.wait()
        # A stop that comes while Spark still starts must wait for the query, not be dropped
        # (found by the chaos runner: a SIGTERM between the query's start and run() seeing it).
        self._query_started.wait()
        # No batch is mid-way once the lock is held, and none delivers after ``stopping`` is set. The
        # lock is not held while the query stops: Spark's stop waits for its stream thread, which
        # may be entering the next batch's foreachBatch and would wait for the lock (a deadlock,
        # found by the chaos runner when batches ran back to back); that batch ends at once instead.
        # A batch may plan a whole backlog (minutes): after the grace its job is cancelled, and the
        # batch raises StopRequested (``stopping`` is set first), so Spark does not mark it done.
        if not self.batches.lock.acquire(timeout=self.stop_grace_s):
            self.batches.stopping.set()
            if self.batches.cancel():
                log.info(
                    "stop: the running batch did not end within %.0fs; cancelled it (its committed "
                    "steps stay; Spark replays the rest on the next start)",
                    self.stop_grace_s,
                )
            self.batches.lock.acquire()
        try:
            self.batches.stopping.set()
        finally:
            self.batches.lock.release()
        if self._query is not None and self._query.isActive:
            self._query.stop()

    def run(self) -> int:
        # Before the first client thread takes an arena of its own.
        footprint.limit_driver_arenas()
        # Before anything is created or started: a wrong setting ends here in two lines, not in Spark.
        preflight.run(self.config)
        if self.metrics is not None and self.config.metrics is not None:
            self.metrics.serve(self.config.metrics)
        try:
            return self._run()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run(self) -> int:
        checkpoint = self.config.checkpoint_location
        master = self.options.master or self.config.spark.master
        log.info("starting Spark (master %s, checkpoint %s)", master, checkpoint)
        # The broker's part of the start needs no Spark (the sink's topics, the source's partitions,
        # the fencing, where a local checkpoint starts, the coordinator's producer, catalog and
        # control-topic position): it runs while the driver JVM starts, instead of before it (about
        # 1 s of round trips at 300 topics, docs/benchmarks/many-topics-side-by-side.md).
        with ThreadPoolExecutor(1, thread_name_prefix="fanout-sink-start") as starter:
            prepared = starter.submit(self._prepare)
            try:
                spark = build_spark_session(
                    self.config.catalog,
                    master=master,
                    app_name=self.config.name,
                    # Spark's own metrics system then reports the query's rates and durations too.
                    extra_conf={
                        "spark.sql.streaming.metricsEnabled": "true",
                        # Executors import the task's modules once, before forking their workers.
                        "spark.python.daemon.module": "fanout_sink.spark.worker_daemon",
                        # Rounds of many tables commit in Spark jobs beside the batches.
                        **executor_commits.spark_conf(),
                        **footprint.app_conf(self.config.spark.conf, dict(self.options.spark_conf)),
                    },
                    light_jit=True,
                    checkpoint=checkpoint,
                    log_format=self.config.logging.format,
                )
            except BaseException:
                if prepared.exception() is None:  # waits for it: a coordinator it started is stopped
                    self._coordinator = prepared.result().coordinator
                    self._stop_coordinator()
                raise
            partitions, starting, self._coordinator = prepared.result()
        self._spark_context.set_result(spark.sparkContext)
        # The executors' Python workers and their state, built while the query starts and plans.
        worker_warmup.start(spark.sparkContext, self.tasks)
        interval = maintenance_schedule.schedule_interval(self.config)
        schedule = (
            maintenance_schedule.MaintenanceSchedule(spark, self.config, interval) if interval else None
        )
        try:
            if starting is None:
                starting = planning.plan_start(self.config, self.channel, partitions, spark)
            if schedule is not None:
                schedule.start()
            self._run_query(spark, starting)
        except Exception as exc:
            if self.batches.stopping.is_set() and StopRequested.__name__ in str(exc):
                log.info("the query stopped before its batch was done; the next start replays it")
                return 0
            if self.record_error is not None:  # the operator needs the record, not Spark's traces
                raise self.record_error from None
            if self.batches.failure is not None:  # logged with its traceback where the batch failed
                raise self.batches.failure from None
            raise
        finally:
            if schedule is not None:  # before the final round: that commit runs alone
                schedule.stop()
            self._stop_coordinator()
        return 0

    def _run_query(self, spark: Any, starting: str) -> None:
        spark.streams.addListener(progress.ProgressLogger())
        if self.metrics is not None:
            self.metrics.on_change = SparkMetricsMirror(spark, self.metrics.registry).update
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        threading.Thread(target=self._stopper, name="fanout-sink-stopper", daemon=True).start()
        limit = self.options.max_offsets_per_trigger or self.config.spark.max_offsets_per_trigger
        writer = (
            self._stream(spark, starting, limit)
            .writeStream.queryName(self.config.name)
            .foreachBatch(self.batches)
            .option("checkpointLocation", self.config.checkpoint_location)
        )
        if self.options.available_now or self.config.spark.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            interval = self.options.trigger_interval or self.config.spark.trigger_interval
            writer = writer.trigger(processingTime=f"{int(interval.total_seconds() * 1000)} milliseconds")
        self._query = writer.start()
        self._query_started.set()
        # Waits of a second: CPython runs a signal handler in the main thread only, between bytecodes,
        # and the kernel may hand SIGTERM to another of the app's threads; an unbounded wait here then
        # hid it until the query ended (CI: no "stop requested" for 180 s, then SIGKILL).
        while not self._query.awaitTermination(1):
            pass
        progress.drain_listeners(spark)

    def _stream(self, spark: Any, starting: str, limit: int | None) -> Any:
        """The streaming DataFrame that plans the micro-batches: Spark's Kafka source. The benchmark's
        planner prototype (``tests/bench/python_source``) puts a Python data source here."""
        return read_stream(spark, self.config, starting, limit)

    def _prepare(self) -> _Prepared:
        """The start's broker part, in its order: the sink's topics, the source's partitions, fencing
        the other layouts, where a local checkpoint starts, then the coordinator."""
        channel = self.channel
        ensure_control_topic(channel, settings=self.config.control.topic_settings())
        if self.config.dead_letter is not None:
            dead_letter = self.config.dead_letter
            ensure_topic(
                channel.clients, dead_letter.topic, "dead-letter topic", dead_letter.topic_settings()
            )
        partitions = planning.source_partitions(self.config, channel)
        # Before anything delivers or restores a position under this layout's transactional ids.
        group_layout.fence_other_layouts(channel, [(t, p) for t, n in partitions.items() for p in range(n)])
        # A checkpoint on an object store or HDFS is read through the session's JVM: planned after it.
        local = planning.is_local_checkpoint(self.config.checkpoint_location)
        starting = planning.plan_start(self.config, channel, partitions) if local else None
        return _Prepared(partitions, starting, self._start_coordinator())

    def _start_coordinator(self) -> Coordinator:
        """The coordinator with its collaborators, started: its catalog, its commit runner (rounds of
        many tables go to the executors once the session exists, the rest stay on the driver's
        threads), the round trigger the batches feed, the metrics and the batch lock."""
        catalog = load_catalog(self.config.catalog)
        settings = CoordinatorSettings.of(self.config)
        on_driver = ThreadedCommits(TableCommitter(self.config.name, catalog), settings.max_parallel_commits)
        coordinator = Coordinator(
            self.channel,
            catalog,
            settings,
            table_commits=executor_commits.SparkTableCommits(
                self._spark_context,
                self.tasks,
                on_driver=on_driver,
                min_tables=self.config.control.distributed_commit_min_tables,
            ),
            rounds=self.rounds,
            observer=self.metrics,
            workers_idle=self.batches.lock,
        )
        coordinator.start()
        return coordinator

    def _stop_coordinator(self) -> None:
        if self._coordinator is None:
            return
        try:
            result = self._coordinator.stop(commit_now=True)
            if result is not None:
                log.info("%s", final_round_words(result), extra={"commit_id": result.commit_id})
        except Exception as exc:
            if self.batches.failure is None:
                raise
            # The app stops with the batch's failure (which names a stopped coordinator's error,
            # logged with its traceback when it stopped); this one must not replace it.
            log.error("final commit round failed: %s", exc)
        finally:
            self._coordinator.close()
