"""The executors' Python workers started while the streaming query plans its first batch.

A run's first batch waited, after the query had planned it, for Spark to start each executor's Python
daemon (the sink's imports: :mod:`.worker_daemon`) and for each forked worker to build its state
(catalog, processor, reader: :mod:`.executor_context`): ~2 of the 20 s of issue 50's 300 topics into
300 tables, with both cores otherwise waiting on the driver JVM's planning. One task per task slot
builds them as soon as the session exists, beside the query's start and planning; Spark reuses its
Python workers, so the batch's tasks find them and their state ready.

Nothing is read, delivered or fenced: the state holds no transaction and no group membership (the
reader assigns partitions per task), so exactly-once is not concerned. A failed warm-up only logs: the
batch's first tasks build the same state themselves, as before.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from fanout_sink.spark.executor_context import TaskSetup, executor_context

log = logging.getLogger(__name__)


def warm(setup: TaskSetup, _slot: Iterable[Any]) -> Iterator[bool]:
    """A warm-up task: this Python worker's executor state for ``setup``, built now; yields whether
    this task built it (False: the worker had it already)."""
    context = executor_context(setup)
    had = context.has_delivery()
    for lane in range(setup.config.spark.groups_per_task):
        context.delivery(lane)
    yield not had


def start(spark_context: Any, setup: TaskSetup) -> threading.Thread:
    """Run one warm-up task per task slot (``defaultParallelism``) in a job of a thread of its own,
    or per ``spark.groups-per-task`` slots (a batch's task then serves that many groups on threads:
    more warm-up tasks at once would fork Python workers no batch uses); returns the thread (a
    daemon: nothing waits for it)."""
    per_task = setup.config.spark.groups_per_task
    slots = max(1, -(-int(spark_context.defaultParallelism) // per_task))

    def job() -> None:
        started = time.monotonic()
        try:
            built = spark_context.parallelize(range(slots), slots).mapPartitions(
                functools.partial(warm, setup)
            )
            count = sum(built.collect())
        except Exception as exc:  # the batch's tasks build the state themselves
            log.debug("warming the Python workers failed: %s", exc)
            return
        log.info(
            "Python workers ready in %.1fs (%d task slot(s), %d built their state)",
            time.monotonic() - started,
            slots,
            count,
        )

    thread = threading.Thread(target=job, name="fanout-sink-warm-up", daemon=True)
    thread.start()
    return thread
