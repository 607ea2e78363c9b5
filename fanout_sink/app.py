"""The Spark Structured Streaming application: Kafka source -> foreachBatch -> workers -> coordinator.

Executors run the worker commit unit on Arrow batches (``mapInArrow``), one Spark task per source
topic-partition per micro-batch, because a partition split across tasks would share one
transactional id. The driver plans each batch from Spark's offset log, commits the planned ranges
that carried no visible record itself (their end offset must still reach the sink group), and hosts
the coordinator thread. Spark's checkpoint only drives Spark; the sink-managed consumer group is
the truth about what was delivered (invariant I1).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import resource
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from fanout_sink import channel, offsets, progress, source_offsets
from fanout_sink.catalog import load_catalog
from fanout_sink.config import SinkConfig
from fanout_sink.coordinator import Coordinator
from fanout_sink.errors import FanoutSinkError, RecordError
from fanout_sink.java_kafka import spark_kafka_options
from fanout_sink.records import RAW_RECORD_SCHEMA
from fanout_sink.worker import SliceResult, SliceWorker

log = logging.getLogger("fanout_sink.app")

RESULT_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("start", pa.int64()),
        pa.field("end", pa.int64()),
        pa.field("records_in", pa.int64()),
        pa.field("skipped", pa.int64()),
        pa.field("dead_lettered", pa.int64()),
        pa.field("filtered", pa.int64()),
        pa.field("rows", pa.string()),
        pa.field("files", pa.string()),
        pa.field("peak_rss_mb", pa.int64()),
    ]
)
# The same columns in Spark's DDL, as mapInArrow declares its output.
RESULT_DDL = ", ".join(
    f"`{f.name}` {'string' if f.type == pa.string() else 'int' if f.type == pa.int32() else 'bigint'}"
    for f in RESULT_SCHEMA
)
_SPLITTING_OPTIONS = ("minPartitions", "maxRecordsPerPartition")


@dataclass(frozen=True)
class RunOptions:
    """Command-line overrides of the ``spark`` section."""

    master: str | None = None
    available_now: bool = False
    trigger_interval: timedelta | None = None
    max_offsets_per_trigger: int | None = None
    batch_retries: int = 3
    spark_conf: tuple[tuple[str, str], ...] = ()


# --- executor side -------------------------------------------------------------------------------

_EXECUTOR_STATE: dict[str, tuple[SliceWorker, Any]] = {}
_EXECUTOR_LOCK = threading.Lock()


def config_key(config: SinkConfig) -> str:
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def _executor_state(key: str, config: SinkConfig) -> tuple[SliceWorker, Any]:
    """One worker and one processor per Python worker process and config, reused across tasks:
    producers, catalog connections and loaded tables outlive a single micro-batch."""
    with _EXECUTOR_LOCK:
        if key not in _EXECUTOR_STATE:
            from fanout_sink.processor import build_processor

            processor = build_processor(config, load_catalog(config.catalog))
            _EXECUTOR_STATE[key] = (_slice_worker(config), processor)
        return _EXECUTOR_STATE[key]


def _slice_worker(config: SinkConfig) -> SliceWorker:
    return SliceWorker(
        sink_name=config.name,
        kafka_conf=dict(config.kafka),
        control_topic=control_topic(config),
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
    )


def _result_batch(result: SliceResult) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "topic": result.topic,
                "partition": result.partition,
                "start": result.start_offset,
                "end": result.end_offset,
                "records_in": result.records_in,
                "skipped": result.skipped_delivered,
                "dead_lettered": result.dead_lettered,
                "filtered": result.filtered,
                "rows": json.dumps(result.rows),
                "files": json.dumps(result.files),
                # The process that ran the slice (an executor's Python worker, or the driver).
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        ],
        schema=RESULT_SCHEMA,
    )


def run_task(
    key: str, config: SinkConfig, ranges: offsets.PlannedRanges, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark task = one source topic-partition's slice of the micro-batch."""
    collected = [batch for batch in batches if batch.num_rows]
    if not collected:
        return
    raw = pa.Table.from_batches(collected).cast(RAW_RECORD_SCHEMA)
    topics, partitions = raw["topic"].unique(), raw["partition"].unique()
    if len(topics) != 1 or len(partitions) != 1:
        raise FanoutSinkError(
            "a Spark task received records of more than one Kafka partition "
            f"({topics.to_pylist()} / {partitions.to_pylist()}); the sink needs one task per partition. "
            f"Remove the Kafka source options {', '.join(_SPLITTING_OPTIONS)} if you set them."
        )
    topic, partition = str(topics[0]), int(partitions[0].as_py())
    start, end = ranges[(topic, partition)]
    worker, processor = _executor_state(key, config)
    yield _result_batch(worker.commit_slice(topic, partition, start, end, raw, processor))


# --- driver side ---------------------------------------------------------------------------------


def control_topic(config: SinkConfig) -> str:
    return config.control.topic or f"{config.name}-control"


def checkpoint_location(config: SinkConfig) -> str:
    base = config.spark.checkpoint_location or str(config.base_dir / ".fanout-sink" / "checkpoints")
    return str(Path(base) / config.name)


def _java_client_names(spark: Any) -> frozenset[str]:
    """Property names the Java consumer and admin client on Spark's classpath know (Spark's Kafka
    source uses both), asked from the JVM so that they match its kafka-clients version."""
    clients = spark._jvm.org.apache.kafka.clients
    consumer = clients.consumer.ConsumerConfig.configNames()
    admin = clients.admin.AdminClientConfig.configNames()
    return frozenset(str(name) for names in (consumer, admin) for name in names)


class SinkApp:
    """Runs one sink: the streaming query, the per-batch driver work and the coordinator thread."""

    def __init__(self, config: SinkConfig, options: RunOptions | None = None) -> None:
        self.config = config
        self.options = options or RunOptions()
        self.checkpoint = checkpoint_location(config)
        self._config_key = config_key(config)
        self._driver_worker = _slice_worker(config)
        self._stop_requested = threading.Event()
        self._query_started = threading.Event()
        self._batch_lock = threading.Lock()
        self._query: Any = None
        self._processor: Any = None
        self._coordinator: Coordinator | None = None
        self.batches_done = 0
        self.record_error: RecordError | None = None
        """The bad record that stopped the query (``errors.tolerance: none``), raised by :meth:`run`."""

    # planning and recovery

    def _topics_and_partitions(self) -> dict[str, int]:
        admin = AdminClient(channel._client_conf(dict(self.config.kafka)))
        metadata = admin.list_topics(timeout=30)
        wanted = list(self.config.source.topics)
        if self.config.source.pattern:
            rx = re.compile(self.config.source.pattern)
            wanted += [t for t in metadata.topics if rx.fullmatch(t) and not t.startswith("__")]
        missing = [t for t in wanted if t not in metadata.topics]
        if missing:
            raise FanoutSinkError(
                f"source topics {missing} do not exist on {self.config.kafka.get('bootstrap.servers')}; "
                "create them or fix source.topics"
            )
        return {t: len(metadata.topics[t].partitions) for t in sorted(set(wanted))}

    def _sink_group_offsets(self, partitions: dict[str, int]) -> dict[offsets.TopicPartitionKey, int]:
        """What the sink group says was delivered, read without waiting for open transactions.

        Only where Spark starts reading depends on it: an answer that is too low (a transaction still
        pending) is harmless, because each worker fences, reads stably and skips what is delivered.
        """
        reader = source_offsets.GroupOffsets(dict(self.config.kafka), self._driver_worker.group, stable=False)
        try:
            wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
            found = reader.committed(wanted)
        finally:
            reader.close()
        return {key: value for key, value in found.items() if value is not None}

    def _reconcile_checkpoint(self, committed: dict[offsets.TopicPartitionKey, int]) -> None:
        """A checkpoint ahead of the sink group would skip undelivered records: move it aside."""
        root = Path(self.checkpoint)
        if not root.exists():
            return
        ends = offsets.last_committed_ends(self.checkpoint)
        if ends is None:
            return
        ahead = {key: (end, committed.get(key)) for key, end in ends.items() if end > committed.get(key, -1)}
        if not ahead:
            behind = {key for key, end in ends.items() if end < committed.get(key, end)}
            if behind:
                log.info(
                    "the Spark checkpoint is behind the sink group on %s: those records were delivered "
                    "already and are skipped",
                    sorted(behind),
                )
            return
        stale = root.with_name(f"{root.name}.stale-{int(time.time())}")
        shutil.move(str(root), stale)
        detail = ", ".join(f"{t}[{p}]: checkpoint {e}, group {c}" for (t, p), (e, c) in sorted(ahead.items()))
        log.warning(
            "the Spark checkpoint is ahead of the sink-managed group (%s). The group is the truth about "
            "what was delivered, so the checkpoint was moved to %s and the stream restarts from the "
            "group's offsets.",
            detail,
            stale,
        )

    # streaming

    def _read_stream(self, spark: Any, starting: str) -> Any:
        source = self.config.source
        reader = (
            spark.readStream.format("kafka")
            .option("includeHeaders", "true")
            .option("startingOffsets", starting)
            .option("failOnDataLoss", "true")
        )
        kafka = spark_kafka_options(self.config.kafka, _java_client_names(spark))
        if kafka.left_out:
            log.info(
                "kafka properties not given to Spark's Kafka source (unknown to the Java client, or "
                "refused by Spark): %s",
                ", ".join(kafka.left_out),
            )
        reader = reader.options(**kafka.options)
        # After the user's properties, so read_committed always wins: aborted records never reach a worker.
        reader = reader.option("kafka.isolation.level", "read_committed")
        if source.pattern:
            reader = reader.option("subscribePattern", source.pattern)
        else:
            reader = reader.option("subscribe", ",".join(source.topics))
        limit = self.options.max_offsets_per_trigger or self.config.spark.max_offsets_per_trigger
        if limit:
            reader = reader.option("maxOffsetsPerTrigger", str(limit))
        return progress.observe(reader.load())

    def process_batch(self, frame: Any, batch_id: int) -> None:
        """foreachBatch body: deliver every planned slice, retrying the batch on failure."""
        with self._batch_lock:
            if self._coordinator is not None and self._coordinator.error is not None:
                raise FanoutSinkError(
                    f"the coordinator of sink {self.config.name!r} stopped: {self._coordinator.error}. "
                    "Restart the app; it resumes from the sink group and the tables' summaries."
                ) from self._coordinator.error
            ranges = offsets.planned_ranges(self.checkpoint, batch_id)
            started = time.monotonic()
            for attempt in range(1, self.options.batch_retries + 1):
                try:
                    results = self._run_batch(frame, ranges)
                    break
                except Exception as exc:
                    # A bad record under errors.tolerance: none fails the same way on every retry.
                    self.record_error = RecordError.find(str(exc))
                    if self.record_error is not None:
                        raise self.record_error from exc
                    if attempt == self.options.batch_retries or isinstance(exc, FanoutSinkError):
                        raise
                    log.warning("batch %d attempt %d failed (%s); retrying the batch", batch_id, attempt, exc)
            self.batches_done += 1
            self._log_batch(batch_id, results, time.monotonic() - started)

    def _run_batch(self, frame: Any, ranges: offsets.PlannedRanges) -> list[dict[str, Any]]:
        task = functools.partial(run_task, self._config_key, self.config, ranges)
        rows = [row.asDict() for row in frame.mapInArrow(task, RESULT_DDL).collect()]
        reported = {(row["topic"], row["partition"]) for row in rows}
        for (topic, partition), (start, end) in sorted(ranges.items()):
            if (topic, partition) in reported or end <= start:
                continue
            # Offsets without a visible record (markers, aborted): the end offset must be committed too.
            empty = RAW_RECORD_SCHEMA.empty_table()
            result = self._driver_worker.commit_slice(
                topic, partition, start, end, empty, self._driver_processor()
            )
            rows.append(_result_batch(result).to_pylist()[0])
        return rows

    def _driver_processor(self) -> Any:
        if self._processor is None:
            from fanout_sink.processor import build_processor

            self._processor = build_processor(self.config, load_catalog(self.config.catalog))
        return self._processor

    def _log_batch(self, batch_id: int, results: list[dict[str, Any]], seconds: float) -> None:
        tables: dict[str, int] = {}
        files: dict[str, int] = {}
        for row in results:
            for name, count in json.loads(row["rows"]).items():
                tables[name] = tables.get(name, 0) + count
            for name, count in json.loads(row["files"]).items():
                files[name] = files.get(name, 0) + count
        log.info(
            "batch %d: %d records in, %d already delivered, %d dead-lettered, %d filtered, rows %s, files %s "
            "(%.1fs, %d slices, peak worker RSS %d MB)",
            batch_id,
            sum(r["records_in"] for r in results),
            sum(r["skipped"] for r in results),
            sum(r["dead_lettered"] for r in results),
            sum(r["filtered"] for r in results),
            json.dumps(tables, sort_keys=True),
            json.dumps(files, sort_keys=True),
            seconds,
            len(results),
            max((r["peak_rss_mb"] for r in results), default=0),
        )

    def request_stop(self, *_: Any) -> None:
        """SIGTERM / Ctrl-C: let the running batch finish, then stop the query (see ``_stopper``)."""
        log.info("stop requested: finishing the current batch, then committing")
        self._stop_requested.set()

    def _stopper(self) -> None:
        self._stop_requested.wait()
        # A stop that comes while Spark still starts must wait for the query, not be dropped
        # (found by the chaos runner: a SIGTERM between the query's start and run() seeing it).
        self._query_started.wait()
        with self._batch_lock:  # no batch is mid-way while the query stops
            if self._query is not None and self._query.isActive:
                self._query.stop()

    def run(self) -> int:
        from fanout_sink.spark_session import build_spark_session

        channel.ensure_control_topic(dict(self.config.kafka), control_topic(self.config))
        if self.config.dead_letter is not None:
            channel.ensure_topic(dict(self.config.kafka), self.config.dead_letter.topic, "dead-letter topic")
        partitions = self._topics_and_partitions()
        committed = self._sink_group_offsets(partitions)
        delivered = {f"{t}[{p}]": o for (t, p), o in sorted(committed.items())}
        log.info("source partitions %s; sink group has delivered up to %s", partitions, delivered)
        self._reconcile_checkpoint(committed)
        starting = offsets.starting_offsets_option(
            list(partitions), partitions, committed, self.config.source.starting_offsets
        )
        master = self.options.master or self.config.spark.master
        log.info("starting Spark (master %s, checkpoint %s)", master, self.checkpoint)
        spark = build_spark_session(
            self.config.catalog,
            master=master,
            app_name=self.config.name,
            extra_conf=dict(self.options.spark_conf),
        )
        spark.streams.addListener(progress.ProgressLogger())
        self._coordinator = self._start_coordinator(list(partitions))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        threading.Thread(target=self._stopper, name="fanout-sink-stopper", daemon=True).start()
        writer = (
            self._read_stream(spark, starting)
            .writeStream.queryName(self.config.name)
            .foreachBatch(self.process_batch)
            .option("checkpointLocation", self.checkpoint)
        )
        if self.options.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            interval = self.options.trigger_interval or self.config.spark.trigger_interval
            writer = writer.trigger(processingTime=f"{int(interval.total_seconds() * 1000)} milliseconds")
        self._query = writer.start()
        self._query_started.set()
        try:
            self._query.awaitTermination()
        except Exception:
            if self.record_error is not None:  # the operator needs the record, not Spark's traces
                raise self.record_error from None
            raise
        finally:
            self._stop_coordinator()
        return 0

    def _start_coordinator(self, topics: list[str]) -> Coordinator:
        control = self.config.control
        coordinator = Coordinator(
            sink=self.config.name,
            kafka_conf=dict(self.config.kafka),
            control_topic=control_topic(self.config),
            catalog=load_catalog(self.config.catalog),
            source_topics=topics,
            commit_interval_s=control.commit_interval.total_seconds(),
            commit_timeout_s=control.commit_timeout.total_seconds(),
        )
        coordinator.start()
        return coordinator

    def _stop_coordinator(self) -> None:
        if self._coordinator is None:
            return
        try:
            result = self._coordinator.stop(commit_now=True)
            if result is not None:
                log.info("final commit round: %s", result)
        finally:
            self._coordinator.close()
