"""Spark's own streaming progress for the sink: observed metrics on the source, logged per batch.

The batch log of the app says what the workers did (rows and files per table, dead letters); this
adds what Spark saw (input rows and rate, the newest record timestamp, batch durations), in the
query's ``StreamingQueryProgress`` where Spark UIs and listeners look for it.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

OBSERVATION = "fanout_sink"
log = logging.getLogger("fanout_sink.progress")


def observe(frame: Any) -> Any:
    """Attach per-batch metrics to the Kafka source: records read and their newest timestamp."""
    return frame.observe(
        OBSERVATION,
        F.count(F.lit(1)).alias("records_in"),
        F.max("timestamp").alias("max_record_timestamp"),
    )


class ProgressLogger(StreamingQueryListener):  # type: ignore[misc]
    """Logs one line per micro-batch from Spark's progress event."""

    def onQueryStarted(self, event: Any) -> None:
        log.info("streaming query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        observed = progress.observedMetrics.get(OBSERVATION)
        log.info(
            "spark progress: batch %d, %d input rows (%.0f rows/s), observed %s, durations ms %s",
            progress.batchId,
            progress.numInputRows,
            progress.processedRowsPerSecond or 0.0,
            observed.asDict() if observed is not None else {},
            dict(progress.durationMs),
        )

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            log.error("streaming query stopped with an error: %s", event.exception)
