"""Spark's own streaming progress for the sink, logged per batch: where Spark's time went.

The batch log of the app says what the workers did (records and records/s, rows and files per
table, dead letters). Spark's input counts say nothing here: the micro-batch DataFrame is never
executed (the tasks read Kafka themselves), so ``numInputRows`` is always 0 and is not logged. What
Spark adds is the batch's durations (planning the offsets, writing the offset log, the batch).
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from fanout_sink.logs import TRACEBACK
from fanout_sink.spark.task_failure import task_failure

log = logging.getLogger("fanout_sink.progress")

LISTENER_DRAIN_MS = 10_000
"""How long a stopping app waits for Spark to hand its last events to the listeners."""


def drain_listeners(spark: Any) -> None:
    """Wait until Spark's listener bus has handed every event to its listeners (at most
    :data:`LISTENER_DRAIN_MS`). Spark posts a query's last progress asynchronously, after the query
    has returned, to this Python listener through py4j's callback server: an app stopping at once
    closed that server first, and the last batch's progress line was lost (its delivery failed in
    py4j's ``CallbackClient``)."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(LISTENER_DRAIN_MS)
    except Exception as exc:  # still busy after the wait: the line is lost, nothing else
        log.debug("Spark's listener events not all delivered before the stop: %s", exc)


class ProgressLogger(StreamingQueryListener):  # type: ignore[misc]
    """Logs one line per micro-batch from Spark's progress event."""

    def onQueryStarted(self, event: Any) -> None:
        log.info("streaming query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        # Detail: the sink's own batch line says what an operator needs (records, rows, files, time).
        log.debug("spark progress: batch %d, durations ms %s", progress.batchId, dict(progress.durationMs))

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            # DEBUG: the app stops with the one message that says why (the bad record, the batch that
            # failed, whose traceback its batch logged), or with the error itself when it is neither.
            failure = task_failure(event.exception)
            log.debug(
                "streaming query stopped with an error: %s",
                failure.summary,
                extra={TRACEBACK: failure.traceback},
            )
