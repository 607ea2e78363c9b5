"""What an on-call engineer scrapes: the sink's own metrics in Prometheus format, served by the driver.

The values already exist on the driver; this module only records them as they go by, so a scrape
costs no Kafka or catalog call: each commit round of the coordinator (per table: rows, files,
commit time, failures; VTTS; per source partition the lag, from the positions the round reads
anyway for VTTS) and each micro-batch (duration, records read and dead letters per source topic).
``fanout-sink status`` reads the same quantities from the sources of truth instead, for a sink that
is down. ``prometheus_client`` serves ``/metrics`` from its own thread; the registry is private to
the sink, so several sinks (or tests) in one process never share a series.

Names follow Prometheus conventions: ``fanout_sink_`` prefix, ``_total`` counters, ``_seconds`` and
``_timestamp_seconds`` (Unix time) gauges, labels ``sink``, ``table``, ``topic``, ``partition``.
``docs/monitoring.md`` describes each one; the Grafana dashboard and the alert rules over them are in
``docs/monitoring/`` (``tests/test_monitoring_assets.py`` holds them to these names).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from importlib.metadata import version
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from fanout_sink.config.runtime import MetricsSettings
from fanout_sink.errors import PreflightError
from fanout_sink.kafka.offsets import PartitionPosition
from fanout_sink.protocol.coordinator import RoundResult
from fanout_sink.protocol.slices import SliceResult
from fanout_sink.protocol.table_cadence import CommitIntervals

log = logging.getLogger(__name__)

BATCH_SECONDS_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""A micro-batch takes from under a second (a few records) to minutes (a capped backlog); a commit
round from a fraction of a second (a few tables) to its ``control.commit-timeout`` (many tables, or a
slow catalog): the same buckets serve both."""

_VTTS_KEEPING = ("committed", "already-committed")
"""Outcomes after which a table holds everything up to the round's VTTS."""


class SinkMetrics:
    """One sink's metrics: the coordinator's :class:`~fanout_sink.protocol.coordinator.RoundObserver`,
    fed per batch by the batch runner, and served over HTTP by :meth:`serve`."""

    def __init__(
        self, sink: str, commit_interval_s: float, commit_intervals: CommitIntervals | None = None
    ) -> None:
        """``commit_intervals``: the tables' own ``commit-interval`` (none: all commit every round)."""
        self.sink = sink
        self._commit_interval_s = commit_interval_s
        self._intervals = commit_intervals or CommitIntervals()
        self.registry = CollectorRegistry(auto_describe=True)
        self.on_change: Callable[[], None] | None = None
        """Called after every update (the mirror into Spark's metrics system)."""
        self._server: WSGIServer | None = None
        self._vtts_s: float | None = None
        self._table_vtts_s: dict[str, float] = {}
        self._tables: set[str] = set()
        """Tables that committed at least once: they follow the sink's VTTS while nothing fails."""
        self._held: set[str] = set()
        """Tables whose latest commit failed: their VTTS stays until one succeeds."""
        registry = self.registry
        Info(
            "fanout_sink", "The sink and the fanout_sink version serving these metrics.", registry=registry
        ).info({"sink": sink, "version": version("fanout-sink")})
        table = ["sink", "table"]
        self.last_commit = Gauge(
            "fanout_sink_table_last_commit_timestamp_seconds",
            "When the sink last appended files to the table (Unix time).",
            table,
            registry=registry,
        )
        self.table_vtts = Gauge(
            "fanout_sink_table_vtts_timestamp_seconds",
            "VTTS the table is complete to: every source record at or before it is in the table (Unix time). "
            "Advances every round unless the table's commit fails or its files wait for its commit-interval.",
            table,
            registry=registry,
        )
        self.table_commit_interval = Gauge(
            "fanout_sink_table_commit_interval_seconds",
            "How far apart the table's commits may be: its own commit-interval, else control.commit-interval "
            "(its VTTS age alert scales with it).",
            table,
            registry=registry,
        )
        self.table_vtts_age = Gauge(
            "fanout_sink_table_vtts_age_seconds",
            "Seconds between now (the scrape) and the table's VTTS.",
            table,
            registry=registry,
        )
        self.rows = Counter(
            "fanout_sink_rows_committed", "Rows appended to the table.", table, registry=registry
        )
        self.files = Counter(
            "fanout_sink_files_committed", "Data files appended to the table.", table, registry=registry
        )
        self.changes = Counter(
            "fanout_sink_rows_changed",
            "Change tables: keys inserted or updated, and live rows deleted, per committed round.",
            [*table, "change"],
            registry=registry,
        )
        self.delete_files = Counter(
            "fanout_sink_delete_files_committed",
            "Change tables: position-delete files committed with the table's rows.",
            table,
            registry=registry,
        )
        self.failures = Counter(
            "fanout_sink_commit_failures",
            "Commit rounds in which the table's commit failed (its files stay pending and are retried) "
            "or the table was gone (its files are not appended; an ERROR names them).",
            table,
            registry=registry,
        )
        sink_only = ["sink"]
        self.vtts = Gauge(
            "fanout_sink_vtts_timestamp_seconds",
            "The sink's VTTS at its latest commit round (Unix time).",
            sink_only,
            registry=registry,
        )
        self.vtts_age = Gauge(
            "fanout_sink_vtts_age_seconds",
            "Seconds between now (the scrape) and the sink's VTTS.",
            sink_only,
            registry=registry,
        )
        Gauge(
            "fanout_sink_commit_interval_seconds",
            "control.commit-interval: how often a commit round runs (alert thresholds scale with it).",
            sink_only,
            registry=registry,
        ).labels(sink).set(commit_interval_s)
        self.last_round = Gauge(
            "fanout_sink_last_round_timestamp_seconds",
            "When the latest commit round completed (Unix time).",
            sink_only,
            registry=registry,
        )
        self.rounds = Counter(
            "fanout_sink_commit_rounds",
            "Commit rounds completed, by what started them (trigger): batch-complete (every planned range "
            "of a micro-batch reported), interval (control.commit-interval passed), stop, call.",
            ["sink", "trigger"],
            registry=registry,
        )
        self.round_failures = Counter(
            "fanout_sink_commit_round_failures",
            "Commit rounds that failed as a whole (broker or control topic unreachable); "
            "retried when the next round is due.",
            sink_only,
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "fanout_sink_batch_duration_seconds",
            "Wall time of a micro-batch on the driver, retries included.",
            sink_only,
            buckets=BATCH_SECONDS_BUCKETS,
            registry=registry,
        )
        self.round_seconds = Histogram(
            "fanout_sink_commit_round_duration_seconds",
            "Wall time of a completed commit round on the coordinator: control events, every due table's "
            "commit, the round's transaction.",
            sink_only,
            buckets=BATCH_SECONDS_BUCKETS,
            registry=registry,
        )
        topic = ["sink", "topic"]
        self.records = Counter(
            "fanout_sink_records_read", "Source records read by the tasks.", topic, registry=registry
        )
        self.dead_letters = Counter(
            "fanout_sink_dead_letters",
            "Source records sent to the dead-letter topic, by source topic.",
            topic,
            registry=registry,
        )
        self.lag = Gauge(
            "fanout_sink_partition_lag",
            "Records in the source partition (up to its last stable offset) not yet delivered by the sink, "
            "at the latest commit round.",
            ["sink", "topic", "partition"],
            registry=registry,
        )
        self.vtts_age.labels(sink).set_function(lambda: _age(self._vtts_s))

    # -- serving ----------------------------------------------------------------------------------

    def serve(self, settings: MetricsSettings) -> int:
        """Serve ``/metrics`` on ``settings``' host and port from a daemon thread; returns the port."""
        try:
            self._server, _thread = start_http_server(settings.port, settings.host, self.registry)
        except OSError as exc:
            raise PreflightError(
                f"metrics.port: cannot serve metrics on {settings.host}:{settings.port} "
                f"({exc.strerror or exc})",
                "choose a free metrics.port (another sink on this machine may hold it), or port: 0 for any "
                "free port",
            ) from exc
        port = int(self._server.server_port)
        log.info("Prometheus metrics of sink %r on http://%s:%d/metrics", self.sink, settings.host, port)
        return port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- updates ----------------------------------------------------------------------------------

    def round_done(self, result: RoundResult, positions: list[PartitionPosition]) -> None:
        """A completed commit round (the coordinator's thread)."""
        now = time.time()
        for identifier, outcome in result.tables.items():
            if outcome.outcome == "committed":
                self.last_commit.labels(self.sink, identifier).set(now)
                self.rows.labels(self.sink, identifier).inc(outcome.rows)
                self.files.labels(self.sink, identifier).inc(outcome.files)
                if outcome.inserted or outcome.updated or outcome.deleted or outcome.delete_files:
                    for change, count in (
                        ("inserted", outcome.inserted),
                        ("updated", outcome.updated),
                        ("deleted", outcome.deleted),
                    ):
                        self.changes.labels(self.sink, identifier, change).inc(count)
                    self.delete_files.labels(self.sink, identifier).inc(outcome.delete_files)
            elif outcome.outcome in ("failed", "table-missing", "refused"):
                self.failures.labels(self.sink, identifier).inc()
        for identifier in result.tables.keys() | result.waiting:
            interval = self._intervals.interval_s(identifier)
            own = self._commit_interval_s if interval is None else interval
            self.table_commit_interval.labels(self.sink, identifier).set(own)
        keeping = {t for t, c in result.tables.items() if c.outcome in _VTTS_KEEPING}
        self._tables |= keeping
        self._held = (self._held | result.tables.keys()) - keeping
        if result.vtts_ms is not None:
            vtts_s = result.vtts_ms / 1000
            self.vtts.labels(self.sink).set(vtts_s)
            self._vtts_s = vtts_s
            # A table with nothing due this round holds everything up to the VTTS too; one whose
            # files wait for its commit-interval does not.
            for identifier in keeping | (self._tables - self._held - result.waiting):
                self._set_table_vtts(identifier, vtts_s)
        for position in positions:
            self.lag.labels(self.sink, position.topic, str(position.partition)).set(position.lag)
        self.last_round.labels(self.sink).set(now)
        self.round_seconds.labels(self.sink).observe(result.seconds)
        self.rounds.labels(self.sink, result.reason).inc()
        self._changed()

    def round_failed(self, error: BaseException) -> None:
        self.round_failures.labels(self.sink).inc()
        self._changed()

    def batch_done(self, seconds: float, results: Iterable[SliceResult]) -> None:
        """A micro-batch whose slices all committed (the driver's ``foreachBatch`` thread)."""
        self.batch_seconds.labels(self.sink).observe(seconds)
        for result in results:
            self.records.labels(self.sink, result.slice.topic).inc(result.records_in)
            self.dead_letters.labels(self.sink, result.slice.topic).inc(result.dead_lettered)
        self._changed()

    def _set_table_vtts(self, identifier: str, vtts_s: float) -> None:
        if identifier not in self._table_vtts_s:
            self.table_vtts_age.labels(self.sink, identifier).set_function(
                lambda: _age(self._table_vtts_s.get(identifier))
            )
        self._table_vtts_s[identifier] = vtts_s
        self.table_vtts.labels(self.sink, identifier).set(vtts_s)

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a mirror must never stop a commit round or a batch
                log.warning("mirroring the sink's metrics failed", exc_info=True)


def _age(timestamp_s: float | None) -> float:
    """Seconds since ``timestamp_s`` at scrape time; NaN before the first VTTS is known."""
    return float("nan") if timestamp_s is None else time.time() - timestamp_s
