"""The driver's part of one micro-batch (the ``foreachBatch`` body).

It plans the batch's ranges from Spark's checkpoint, has the executors deliver them
(:mod:`fanout_sink.spark.task`), commits the planned ranges that carried no visible record itself
(their end offset must still reach the sink group), retries a failed batch, and turns a bad record's
task failure back into the :class:`~fanout_sink.errors.RecordError` that caused it.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fanout_sink.catalog import load_catalog
from fanout_sink.config import SinkConfig
from fanout_sink.errors import FanoutSinkError, RecordError
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark import planning
from fanout_sink.spark.task import RESULT_DDL, SliceReport, config_key, run_task, slice_worker
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.records import RAW_RECORD_SCHEMA

log = logging.getLogger("fanout_sink.app")


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
        return (
            f"batch {batch_id}: {self._total('records_in')} records in, "
            f"{self._total('skipped_delivered')} already delivered, {self._total('dead_lettered')} "
            f"dead-lettered, {self._total('filtered')} filtered, rows {json.dumps(self._per_table('rows'))}, "
            f"files {json.dumps(self._per_table('files'))} ({seconds:.1f}s, {len(self.reports)} slices, "
            f"peak worker RSS {max((r.peak_rss_mb for r in self.reports), default=0)} MB)"
        )


class BatchRunner:
    """Runs micro-batches of one sink; ``lock`` is held while a batch runs, so a stop waits for it."""

    def __init__(
        self,
        config: SinkConfig,
        retries: int,
        coordinator_error: Callable[[], BaseException | None],
    ) -> None:
        self.config = config
        self.checkpoint = config.checkpoint_location
        self.retries = retries
        self.lock = threading.Lock()
        self.record_error: RecordError | None = None
        """The bad record that stopped the query (``errors.tolerance: none``)."""
        self._coordinator_error = coordinator_error
        self._config_key = config_key(config)
        self._driver_worker: SliceWorker = slice_worker(config)
        self._processor: RoutingProcessor | None = None

    def __call__(self, frame: Any, batch_id: int) -> None:
        """Deliver every planned slice of batch ``batch_id``, retrying the batch on failure."""
        with self.lock:
            error = self._coordinator_error()
            if error is not None:
                raise FanoutSinkError(
                    f"the coordinator of sink {self.config.name!r} stopped: {error}. "
                    "Restart the app; it resumes from the sink group and the tables' summaries."
                ) from error
            ranges = planning.planned_ranges(self.checkpoint, batch_id)
            started = time.monotonic()
            for attempt in range(1, self.retries + 1):
                try:
                    reports = self._run(frame, ranges)
                    break
                except Exception as exc:
                    # A bad record under errors.tolerance: none fails the same way on every retry.
                    self.record_error = RecordError.find(str(exc))
                    if self.record_error is not None:
                        raise self.record_error from exc
                    if attempt == self.retries or isinstance(exc, FanoutSinkError):
                        raise
                    log.warning("batch %d attempt %d failed (%s); retrying the batch", batch_id, attempt, exc)
            log.info("%s", BatchSummary(reports).describe(batch_id, time.monotonic() - started))

    def _run(self, frame: Any, ranges: planning.PlannedRanges) -> list[SliceReport]:
        task = functools.partial(run_task, self._config_key, self.config, ranges)
        reports = [SliceReport.from_row(row.asDict()) for row in frame.mapInArrow(task, RESULT_DDL).collect()]
        reported = {(r.result.topic, r.result.partition) for r in reports}
        for (topic, partition), (start, end) in sorted(ranges.items()):
            if (topic, partition) in reported or end <= start:
                continue
            # Offsets without a visible record (markers, aborted): the end offset must be committed too.
            result = self._driver_worker.commit_slice(
                topic, partition, start, end, RAW_RECORD_SCHEMA.empty_table(), self._driver_processor()
            )
            reports.append(SliceReport.here(result))
        return reports

    def _driver_processor(self) -> RoutingProcessor:
        if self._processor is None:
            self._processor = build_processor(self.config, load_catalog(self.config.catalog))
        return self._processor
