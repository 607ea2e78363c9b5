"""A round of many tables committed by the Spark executors: one job, each task a share of the tables.

The coordinator's table commits are independent per table but Python-CPU-bound (~12 ms per table:
manifests, manifest list, metadata JSON), so in the driver's one process they share one GIL however
large the cluster is. :class:`SparkTableCommits` is the coordinator's
:class:`~fanout_sink.protocol.commit_runners.TableCommitRunner`, given to it when it is built; once
the app's session exists, a round of at least ``control.distributed-commit-min-tables`` tables
becomes one Spark job (its job group names the round) of one task per share of the tables
(``defaultParallelism`` shares: the executors' cores,
:meth:`~fanout_sink.protocol.commit_runners.RoundTables.split`), and each task commits its share
with the :class:`~fanout_sink.protocol.table_commit.TableCommitter` of its Python worker process's
:class:`~fanout_sink.spark.executor_context.ExecutorContext` (the one the batches' tasks use). The
pending ``DataWritten`` events travel pickled, the ``TableCommit`` outcomes come back pickled; the
coordinator keeps everything else of the round. Small rounds stay on the driver, where a job's
scheduling would cost more than it spreads.

Nothing here needs its own exactly-once rule: every table commit re-checks the table's floor on
freshly loaded metadata in a no-retry transaction (I3, I4), wherever and however often it runs. A
task retried by Spark, a Python worker killed mid-share, a job cancelled: the tables it committed
hold their floor, the others are committed by the retry, by the driver (:attr:`on_driver`, for the
tables the job gave no outcome, while the round has time left) or by the next round.

Scheduling: the coordinator's thread and the micro-batches share the SparkContext. The app runs the
fair scheduler (:func:`spark_conf`); commits go to a pool of their own with a minimum share of one
slot, so a commit job takes the next free slot instead of queueing behind a whole micro-batch, and a
batch's tasks go on in the slots the commits do not use. A job whose tasks have not all started
within :data:`START_WAIT_S` (every slot busy with long tasks) is cancelled and the round committed
on the driver; one still running at the round's deadline is cancelled too (its tables fail for the
round and stay pending). While running tasks hold every slot (a batch delivering a backlog in steps
holds its slots for minutes) no job is submitted: the round commits on the driver at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fanout_sink.logs import TRACEBACK, keep_traceback
from fanout_sink.protocol.commit_runners import RoundTables, TableCommitRunner, commit_in_threads
from fanout_sink.protocol.table_commit import TableCommit
from fanout_sink.spark.executor_context import TaskSetup, executor_context
from fanout_sink.spark.task_failure import task_failure

log = logging.getLogger(__name__)

POOL = "fanout-sink-commits"
"""The fair-scheduler pool of the commit jobs (``fairscheduler.xml``: a minimum share of one slot)."""
START_WAIT_S = 10.0
"""How long a commit job may wait for slots: longer, and the round is committed on the driver."""
CANCEL_GRACE_S = 5.0
"""How long after the round's deadline a job is left to return its tasks' outcomes (a task stops
waiting for its tables at the deadline itself)."""
_JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def spark_conf() -> dict[str, str]:
    """The session properties the commit jobs need: the fair scheduler with the commits' pool."""
    allocation = resources.files("fanout_sink.spark").joinpath("fairscheduler.xml")
    return {
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": f"file://{allocation}",
    }


@dataclass(frozen=True)
class SparkTableCommits:
    """Rounds of at least ``min_tables`` tables committed by Spark tasks, smaller ones (and what a
    job left without an outcome) by ``on_driver``."""

    context: Future[Any]
    """The app's SparkContext, once its session exists (the coordinator starts while the driver JVM
    does): until then every round commits on the driver."""
    setup: TaskSetup
    """The tasks' config and channel, as the batches' tasks get them."""
    on_driver: TableCommitRunner
    min_tables: int
    threads: int = 4
    """Commit threads per task (they overlap catalog and storage waits; CPU stays one core's)."""
    shares: int | None = None
    """Tasks (shares of the round's tables) per job; None: ``defaultParallelism`` (the executors'
    cores). The benchmark sets it."""

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        if len(tables.due) < self.min_tables or not self.context.done():
            return self.on_driver(tables)
        if self._slots_held():
            log.debug(
                "commit %s: every task slot runs a task; the round commits on the driver", tables.commit_id
            )
            return self.on_driver(tables)
        results = self._on_executors(tables)
        missing = [t for t in tables.due if t not in results]
        if missing and tables.remaining_s() > 0:
            # Repeating a commit that did land finds the floor and appends nothing (I3, I4).
            log.warning("commit %s: %d table(s) committed on the driver", tables.commit_id, len(missing))
            results.update(self.on_driver(tables.only(missing)))
        return results

    def _slots_held(self) -> bool:
        """Whether running tasks hold every slot (``defaultParallelism``): a batch that plans a
        backlog keeps its tasks for minutes (they deliver it in steps, ``protocol/pacing.py``), and a
        commit job would only wait :data:`START_WAIT_S` for a slot, round after round, before the
        driver committed anyway."""
        context = self.context.result()
        tracker = context.statusTracker()
        running = 0
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            running += info.numActiveTasks if info is not None else 0
        return bool(running >= context.defaultParallelism)

    def _on_executors(self, tables: RoundTables) -> dict[str, TableCommit]:
        """The outcomes of one job over the round's shares; none when the job failed or was cancelled."""
        context = self.context.result()
        parts = tables.split(self.shares or context.defaultParallelism)
        job_group = f"fanout-sink-commit-{tables.commit_id}"
        task = functools.partial(commit_table_shares, self.setup, self.threads)
        done = threading.Event()
        started = time.monotonic()
        context.setJobGroup(job_group, f"commit {tables.commit_id}: {len(tables.due)} tables", True)
        context.setLocalProperty("spark.scheduler.pool", POOL)
        watcher = threading.Thread(
            target=self._watch,
            args=(job_group, tables.deadline, done),
            name=f"{job_group}-watch",
            daemon=True,
        )
        watcher.start()
        try:
            outcomes: list[TableCommit] = (
                context.parallelize(parts, numSlices=len(parts)).mapPartitions(task).collect()
            )
        except Exception as exc:  # lost tasks past their retries, a cancelled job, a stopped context
            failure = task_failure(exc)
            log.warning(
                "commit %s: the Spark job over %d table(s) gave no outcome: %s%s",
                tables.commit_id,
                len(tables.due),
                failure.summary,
                keep_traceback(f"commit-{tables.commit_id}", failure.traceback),
            )
            log.debug(
                "commit %s: the failed task's traceback",
                tables.commit_id,
                extra={TRACEBACK: failure.traceback},
            )
            log.debug("commit %s: the job's error", tables.commit_id, exc_info=True)
            return {}
        finally:
            done.set()
            for key in (*_JOB_PROPERTIES, "spark.scheduler.pool"):
                context.setLocalProperty(key, None)
        log.info(
            "commit %s: %d tables in %d Spark task(s), %.1f s",
            tables.commit_id,
            len(outcomes),
            len(parts),
            time.monotonic() - started,
        )
        return {outcome.identifier: outcome for outcome in outcomes}

    def _watch(self, job_group: str, deadline: float, done: threading.Event) -> None:
        """Cancel the job when its tasks have not all started within :data:`START_WAIT_S`, or when it
        runs past the round's deadline."""
        start_by: float | None = time.monotonic() + START_WAIT_S
        while not done.wait(0.25):
            if time.monotonic() > deadline + CANCEL_GRACE_S:
                reason = "past the commit timeout"
            elif start_by is not None and time.monotonic() > start_by:
                if self._all_started(job_group):
                    start_by = None
                    continue
                reason = f"no free task slots within {START_WAIT_S:.0f} s"
            else:
                continue
            log.warning("cancelling the commit job %s: %s", job_group, reason)
            self.context.result().cancelJobGroup(job_group)
            return

    def _all_started(self, job_group: str) -> bool:
        tracker = self.context.result().statusTracker()
        for job in tracker.getJobIdsForGroup(job_group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                found = tracker.getStageInfo(stage)
                if found is not None and found.numActiveTasks + found.numCompletedTasks < found.numTasks:
                    return False
        return True


def commit_table_shares(
    setup: TaskSetup, threads: int, parts: Iterable[RoundTables]
) -> Iterator[TableCommit]:
    """One Spark task: the tables of its share (``parts``: normally one) committed here, an outcome
    per table, by the committer of this Python worker process's context (its catalog outlives a
    round)."""
    committer = executor_context(setup).committer
    for part in parts:
        yield from commit_in_threads(committer, part, threads).values()
