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

from fanout_sink.spark.task_failure import task_failure

log = logging.getLogger("fanout_sink.progress")


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
            # One line: the batch that failed logged the error and its traceback already.
            log.error("streaming query stopped with an error: %s", task_failure(event.exception).summary)
