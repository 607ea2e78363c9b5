"""``maintenance.interval`` inside ``fanout-sink run``: which tables are due, and the thread that
maintains them with the app's own Spark session (:func:`fanout_sink.spark.maintenance.maintain`)."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from pyiceberg.catalog import Catalog

from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.maintenance.report import failed_steps, table_line
from fanout_sink.protocol import table_state
from fanout_sink.spark.maintenance import maintain_run

log = logging.getLogger("fanout_sink.maintenance")


def schedule_interval(config: SinkConfig) -> timedelta | None:
    """How often the app looks for tables due for maintenance: the shortest ``interval`` configured
    (top level or any table's); None when none is, and ``run`` then never maintains."""
    intervals = [config.maintenance.interval] + [
        settings.maintenance.interval
        for settings in config.tables.values()
        if settings.maintenance is not None
    ]
    found = [interval for interval in intervals if interval is not None]
    return min(found) if found else None


def due_tables(catalog: Catalog, config: SinkConfig, now_ms: int) -> list[str]:
    """The sink's tables whose own ``interval`` has passed since their last maintenance."""
    due = []
    for found in table_state.sink_tables(catalog, config.name):
        interval = config.maintenance_for(found.identifier).interval
        if interval is None:
            continue
        last = found.table.metadata.properties.get(table_state.MAINTENANCE_LAST_RUN_MS)
        if last is None or now_ms - int(last) >= interval.total_seconds() * 1000:
            due.append(found.identifier)
    return due


class MaintenanceSchedule:
    """``maintenance.interval`` inside ``run``: a daemon thread that maintains the due tables with the
    app's own Spark session, one run at a time.

    A failing run is one ERROR line and is tried again at the next interval: maintenance must never
    stop the sink. ``stop()`` cancels a run in progress (its Spark jobs, through the thread's job
    group) and waits for the thread, so that the app's final commit round runs alone. An idle
    schedule has no job to cancel: Spark answers a cancel of a group without jobs with a WARN line
    ("Failed to cancel job group"), which every run's stop printed.
    """

    JOB_GROUP = "fanout-sink-maintenance"
    POOL = "fanout-sink-maintenance"
    """Its fair-scheduler pool (``fairscheduler.xml``): beside the batches' ``default`` pool, not in it,
    where its rewrite jobs would take every slot before a batch submitted after them."""

    def __init__(self, spark: Any, config: SinkConfig, interval: timedelta) -> None:
        self.spark = spark
        self.config = config
        self.interval = interval
        self.runs = 0
        self._stopping = threading.Event()
        self._running = threading.Event()
        """Set while a run maintains tables: only then has ``stop()`` jobs to cancel."""
        self._thread = threading.Thread(target=self._loop, name="fanout-sink-maintenance", daemon=True)

    def start(self) -> None:
        log.info("maintenance scheduled every %s", self.interval)
        self._thread.start()

    def _loop(self) -> None:
        self.spark.sparkContext.setJobGroup(self.JOB_GROUP, "scheduled table maintenance", True)
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.POOL)
        catalog = load_catalog(self.config.catalog)
        while not self._stopping.wait(self.interval.total_seconds()):
            try:
                due = due_tables(catalog, self.config, int(time.time() * 1000))
                if due:
                    self._running.set()
                    try:
                        run = maintain_run(self.spark, self.config, due, stop=self._stopping)
                    finally:
                        self._running.clear()
                    self.runs += 1
                    results = run.results
                    for result in results:
                        log.info(
                            "scheduled maintenance %s", table_line(result), extra={"table": result.table}
                        )
                    log.info("scheduled maintenance: %s", run.line())
                    failed = failed_steps(results)
                    if failed:
                        log.error(
                            "scheduled maintenance: steps failed (%s), retried in %s; fix: the cause is "
                            "named with each step; `fanout-sink maintain --dry-run` shows what each would do",
                            "; ".join(failed),
                            self.interval,
                        )
            except Exception as exc:
                if self._stopping.is_set():
                    return
                log.error(
                    "scheduled maintenance failed: %s: %s; retried in %s; fix: check that the catalog and "
                    "the control topic are reachable, or run `fanout-sink maintain` for the cause",
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                    self.interval,
                )

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stopping.set()
        if not self._thread.is_alive():
            return
        if self._running.is_set():  # a run starting now sees the stop before its first job
            self.spark.sparkContext.cancelJobGroup(self.JOB_GROUP)
        self._thread.join(timeout_s)
