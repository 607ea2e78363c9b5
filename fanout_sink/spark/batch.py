"""The driver's part of one micro-batch (the ``foreachBatch`` body).

It plans the batch's ranges from Spark's checkpoint and has the executors deliver them, one Spark
task per partition group (``spark.partition-groups``) with a range that moved
(:mod:`fanout_sink.spark.task`; a task reads its ranges from Kafka itself). The micro-batch
DataFrame of Spark's Kafka source is never executed: Spark only plans (end offsets, checkpoint,
triggers, ``maxOffsetsPerTrigger``) and schedules. A range without a
visible record (markers, aborted records) is a task like any other: its end offset must reach the
sink group too. It retries a failed batch and turns a bad record's task failure back into the
:class:`~fanout_sink.errors.RecordError` that caused it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fanout_sink.errors import (
    BatchError,
    FanoutSinkError,
    RecordError,
    StartSupersededError,
    UnknownSchemaIdError,
)
from fanout_sink.kafka.topics import topic_ids
from fanout_sink.logs import TRACEBACK, keep_traceback
from fanout_sink.metrics import SinkMetrics
from fanout_sink.protocol.round_trigger import RoundTrigger
from fanout_sink.protocol.slices import Slice
from fanout_sink.retries import Retry, Tries
from fanout_sink.spark import planning
from fanout_sink.spark.executor_context import TaskSetup
from fanout_sink.spark.task import SliceReport, run_task
from fanout_sink.spark.task_failure import task_failure
from fanout_sink.transform.formats.unknown_ids import UnknownSchemaIds

log = logging.getLogger("fanout_sink.app")

TABLES_NAMED = 10
"""A batch line names at most this many tables (those with most rows), so it stays one short line
for a sink that writes hundreds."""


@dataclass(frozen=True)
class BatchSummary:
    """The slices of one batch, summed for the batch's log line."""

    reports: list[SliceReport]

    def _total(self, counter: str) -> int:
        return sum(int(getattr(r.result, counter)) for r in self.reports)

    def _per_table(self, counter: str) -> dict[str, int]:
        total: Counter[str] = Counter()
        for report in self.reports:
            total.update(getattr(report.result, counter))
        return dict(sorted(total.items()))

    def describe(self, batch_id: int, seconds: float) -> str:
        """One line in words, however many tables: the counts, then rows and files per table for the
        :data:`TABLES_NAMED` tables with most rows (the metrics have every table)."""
        return (
            f"batch {batch_id}: {self._total('records_in')} records in, "
            f"{self._total('skipped_delivered')} already delivered, {self._total('dead_lettered')} "
            f"dead-lettered, {self._total('filtered')} filtered; {self._tables()} ({seconds:.1f}s, "
            f"{len(self.reports)} slices, peak worker RSS "
            f"{max((r.peak_rss_mb for r in self.reports), default=0)} MB), "
            f"{self._total('records_in') / max(seconds, 1e-3):.0f} records/s"
        )

    def _tables(self) -> str:
        rows, files = self._per_table("rows"), self._per_table("files")
        deleted = self._per_table("deleted_keys")  # change tables only
        tables = sorted(set(rows) | set(deleted), key=lambda table: (-rows.get(table, 0), table))
        if not tables:
            return "no rows"
        named = [
            f"{table}: {rows.get(table, 0)} rows, {files.get(table, 0)} files"
            + (f", {deleted[table]} keys deleted" if table in deleted else "")
            for table in tables[:TABLES_NAMED]
        ]
        if len(tables) > TABLES_NAMED:
            named.append(f"{len(tables) - TABLES_NAMED} more tables")
        return (
            f"{sum(rows.values())} rows in {sum(files.values())} files to {len(tables)} table(s) "
            f"({'; '.join(named)})"
        )


class StopRequested(FanoutSinkError):
    """The app's stop came before this batch began, or cancelled it mid-way: Spark's checkpoint does
    not mark it done, and the next start replays it (the steps it committed are skipped then)."""


class BatchRunner:
    """Runs micro-batches of one sink; ``lock`` is held while a batch runs, so a stop waits for it."""

    def __init__(
        self,
        setup: TaskSetup,
        retries: int,
        coordinator_error: Callable[[], BaseException | None],
        metrics: SinkMetrics | None = None,
        rounds: RoundTrigger | None = None,
    ) -> None:
        """``setup``: the config and channel every task of the run gets (the run's layout packs the
        batches' slices)."""
        self.setup = setup
        self.config = setup.config
        self.checkpoint = setup.config.checkpoint_location
        self.retry = Retry(attempts=retries)
        """A failed batch is run again at once, ``retries`` runs in all; a bad record or a sink
        error ends it at once, and a run held up by the Schema Registry is not counted."""
        self.lock = threading.Lock()
        self.record_error: RecordError | None = None
        """The bad record that stopped the query (``errors.tolerance: none``)."""
        self.failure: BatchError | None = None
        """Why the query stopped otherwise: a batch's last attempt failed, or the coordinator stopped."""
        self.stopping = threading.Event()
        """Set by the app's stop: a batch that begins afterwards delivers nothing (:class:`StopRequested`)."""
        self._coordinator_error = coordinator_error
        self._metrics = metrics
        self._rounds = rounds
        """Told each batch's planned ranges and its end, so the coordinator commits once it is reported."""
        self._unknown_ids = UnknownSchemaIds(self.config.source.unknown_schema_id_timeout.total_seconds())
        self._registry_warned: int | None = None
        self._running: tuple[Any, str] | None = None
        """The SparkContext and job group of the batch job running now (see :meth:`cancel`)."""

    def __call__(self, frame: Any, batch_id: int) -> None:
        """Deliver every planned slice of batch ``batch_id``, retrying the batch on failure."""
        with self.lock:
            if self.stopping.is_set():
                raise StopRequested(
                    f"batch {batch_id} of sink {self.config.name!r} was not started: the app is stopping. "
                    "Nothing of it was delivered; Spark replays it on the next start."
                )
            error = self._coordinator_error()
            if error is not None:
                self.failure = BatchError(
                    f"the coordinator of sink {self.config.name!r} stopped: {error}.\n"
                    "  fix: restart the app; it resumes from the sink group and the tables' summaries."
                )
                raise self.failure from error
            ranges = planning.planned_ranges(self.checkpoint, batch_id, frame.sparkSession)
            if self._rounds is not None:
                self._rounds.expect(batch_id, ranges)
            started = time.monotonic()
            tries = self.retry.start()
            while True:
                try:
                    reports = self._run(frame, batch_id, ranges)
                    break
                except Exception as exc:
                    if self.stopping.is_set():  # the stop cancelled the batch's job (:meth:`cancel`)
                        raise StopRequested(
                            f"batch {batch_id} of sink {self.config.name!r} was cancelled by the stop: "
                            "Spark replays it on the next start, and the steps it committed are skipped then"
                        ) from exc
                    # A bad record under errors.tolerance: none fails the same way on every retry.
                    self.record_error = RecordError.find(str(exc))
                    if self.record_error is not None:
                        raise self.record_error from exc
                    superseded = StartSupersededError.find(str(exc))
                    if superseded is not None:  # a newer start refuses every retry alike
                        log.error("batch %d: %s", batch_id, superseded, extra={"batch": batch_id})
                        self.failure = BatchError(f"batch {batch_id} was not delivered: {superseded}")
                        raise superseded from exc
                    if self._unknown_ids.seen(UnknownSchemaIdError.find(str(exc))):
                        # Not counted: the registry may still learn the ids, and the tasks
                        # dead-letter their records once the timeout has passed.
                        self._log_registry_wait(batch_id, exc)
                        if self.stopping.is_set():
                            raise StopRequested(
                                f"batch {batch_id} of sink {self.config.name!r} stopped while waiting "
                                "for the Schema Registry to learn schema ids; Spark replays it on the "
                                "next start, and what it delivered is skipped then"
                            ) from exc
                        continue
                    self._log_failure(batch_id, tries, exc)
                    if isinstance(exc, FanoutSinkError) or not tries.again():
                        raise
            if self._rounds is not None:  # a slice that found its range delivered writes no report
                done_before = [r.result for r in reports if not r.result.transaction_committed]
                self._rounds.delivered_before(
                    batch_id, [(r.slice.topic, r.slice.partition) for r in done_before]
                )
                self._rounds.finished(batch_id)
            seconds = time.monotonic() - started
            log.info("%s", BatchSummary(reports).describe(batch_id, seconds), extra={"batch": batch_id})
            if self._metrics is not None:
                self._metrics.batch_done(seconds, [report.result for report in reports])

    def cancel(self) -> bool:
        """Cancel the running batch's Spark job, if any (the app's stop, after its grace): its tasks
        are killed mid-step, their open transactions aborted by the next start's fencing, and the
        batch raises :class:`StopRequested` once ``stopping`` is set. Whether a job was cancelled."""
        running = self._running
        if running is None:
            return False
        context, job_group = running
        context.cancelJobGroup(job_group)
        return True

    def _log_registry_wait(self, batch_id: int, error: Exception) -> None:
        """One WARNING per batch the registry holds up, then DEBUG while it repeats."""
        failure = task_failure(error)
        first = self._registry_warned != batch_id
        self._registry_warned = batch_id
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "batch %d waits for the Schema Registry: %s; retrying the batch",
            batch_id,
            failure.summary,
            extra={"batch": batch_id},
        )

    def _log_failure(self, batch_id: int, tries: Tries, error: Exception) -> None:
        """One line per failed attempt naming the file that holds the failed task's traceback (also
        logged here at DEBUG; Spark's repeats of it are filtered out, see ``spark/log4j2``); Spark's
        Java stack traces only at DEBUG."""
        failure = task_failure(error)
        attempt = tries.number
        last = tries.last or isinstance(error, FanoutSinkError)
        kept = keep_traceback(f"{self.config.name}-batch-{batch_id}-attempt-{attempt}", failure.traceback)
        log.log(
            logging.ERROR if last else logging.WARNING,
            "batch %d attempt %d of %d failed: %s; %s%s",
            batch_id,
            attempt,
            self.retry.attempts,
            failure.summary,
            "giving up" if last else "retrying the batch",
            kept,
            extra={"batch": batch_id, "attempt": attempt},
        )
        log.debug(
            "batch %d attempt %d: the failed task's traceback",
            batch_id,
            attempt,
            extra={"batch": batch_id, "attempt": attempt, TRACEBACK: failure.traceback},
        )
        log.debug("batch %d attempt %d: the job's error", batch_id, attempt, exc_info=error)
        if last:
            where = kept.removeprefix("; traceback in ") or "in the DEBUG log"
            self.failure = BatchError(
                f"batch {batch_id} failed {attempt} time(s): {failure.summary}\n"
                f"  fix: the failed task's traceback is {where}; once its cause is fixed, restart "
                "the app: it resumes after what the sink delivered"
            )

    def _run(self, frame: Any, batch_id: int, ranges: planning.PlannedRanges) -> list[SliceReport]:
        """One task per partition group with a range that moved (``numSlices`` = partition groups: one
        element each; with ``spark.groups-per-task`` k, a task per k of them), in index order; the
        reports (one per slice) come back pickled. ``frame`` (the micro-batch, never executed here) is
        for a planner whose source's tasks deliver the ranges themselves (the benchmark's
        ``python_source`` prototype)."""
        context = frame.sparkSession.sparkContext
        moved = sorted((key, (start, end)) for key, (start, end) in ranges.items() if end > start)
        if not moved:
            return []
        # One describe per batch: every slice's DataComplete names the topic id it was read from.
        ids = topic_ids(self.setup.channel.clients, {topic for (topic, _), _ in moved})
        slices = [
            Slice(topic, partition, start, end, ids.get(topic)) for (topic, partition), (start, end) in moved
        ]
        packed = self.setup.channel.partition_groups.pack(slices)
        # groups-per-task groups per Spark partition at most (parallelize cuts the list evenly).
        tasks = -(-len(packed) // self.config.spark.groups_per_task)
        task = functools.partial(run_task, self.setup, batch_id, dict(self._unknown_ids.since))
        job_group = f"fanout-sink-batch-{self.config.name}-{batch_id}"
        context.setJobGroup(job_group, f"batch {batch_id}: {len(slices)} slices", True)
        self._running = (context, job_group)
        try:
            if self.stopping.is_set():  # the stop looked for a job before this one was named
                raise StopRequested(f"batch {batch_id} of sink {self.config.name!r}: the app is stopping")
            reports: list[SliceReport] = (
                context.parallelize(packed, numSlices=tasks).mapPartitions(task).collect()
            )
        finally:
            self._running = None
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
                context.setLocalProperty(key, None)
        self._unknown_ids.served([i for report in reports for i in report.schema_ids_served])
        return reports
