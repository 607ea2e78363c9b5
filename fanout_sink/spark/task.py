"""The executor side of a micro-batch: one Spark task delivers one source topic-partition's slice.

Spark runs :func:`run_task` through ``mapInArrow`` on the Kafka source's rows. A partition split
across tasks would share one transactional id, so a task that sees two partitions refuses. What a
task did travels back to the driver as one Arrow row per slice whose columns are derived from
:class:`~fanout_sink.protocol.worker.SliceResult`, so a counter added there reaches the driver's
batch log without touching this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import resource
import threading
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from fanout_sink.catalog import load_catalog
from fanout_sink.config import SinkConfig
from fanout_sink.errors import FanoutSinkError
from fanout_sink.protocol.worker import SliceResult, SliceWorker
from fanout_sink.spark.planning import PlannedRanges
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.records import RAW_RECORD_SCHEMA

SPLITTING_OPTIONS = ("minPartitions", "maxRecordsPerPartition")
"""Kafka source options that split one partition across tasks: the sink cannot run with them."""

_PEAK_RSS = "peak_rss_mb"
_HINTS = typing.get_type_hints(SliceResult)
_FIELDS = [f.name for f in dataclasses.fields(SliceResult)]
_JSON_FIELDS = frozenset(name for name in _FIELDS if typing.get_origin(_HINTS[name]) is dict)


def _arrow_type(name: str) -> pa.DataType:
    """Ints and optional ints as int64, strings, booleans; dicts as JSON text (one plain Spark type)."""
    hint = _HINTS[name]
    if name in _JSON_FIELDS or hint is str:
        return pa.string()
    if hint is bool:
        return pa.bool_()
    if int in (hint, *typing.get_args(hint)):
        return pa.int64()
    raise TypeError(f"SliceResult.{name}: {hint} has no column type; add one in {__name__}._arrow_type")


RESULT_SCHEMA = pa.schema(
    [pa.field(name, _arrow_type(name)) for name in _FIELDS] + [pa.field(_PEAK_RSS, pa.int64())]
)
_SPARK_TYPES = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean"}
RESULT_DDL = ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in RESULT_SCHEMA)
"""The same columns in Spark's DDL, as ``mapInArrow`` declares its output."""


@dataclass(frozen=True)
class SliceReport:
    """One slice as the driver sees it: the worker's result and the peak memory of the process that
    ran it (an executor's Python worker, or the driver for ranges without a visible record)."""

    result: SliceResult
    peak_rss_mb: int

    @classmethod
    def here(cls, result: SliceResult) -> SliceReport:
        return cls(result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)

    def to_batch(self) -> pa.RecordBatch:
        row: dict[str, Any] = dataclasses.asdict(self.result)
        for name in _JSON_FIELDS:
            row[name] = json.dumps(row[name])
        row[_PEAK_RSS] = self.peak_rss_mb
        return pa.RecordBatch.from_pylist([row], schema=RESULT_SCHEMA)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SliceReport:
        values = {name: json.loads(row[name]) if name in _JSON_FIELDS else row[name] for name in _FIELDS}
        return cls(SliceResult(**values), int(row[_PEAK_RSS]))


def config_key(config: SinkConfig) -> str:
    """Identifies a config across tasks, so executor state built for one is never used for another."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def slice_worker(config: SinkConfig) -> SliceWorker:
    return SliceWorker(
        sink_name=config.name,
        kafka_conf=dict(config.kafka),
        control_topic=config.control_topic,
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
    )


_EXECUTOR_STATE: dict[str, tuple[SliceWorker, RoutingProcessor]] = {}
_EXECUTOR_LOCK = threading.Lock()


def _executor_state(key: str, config: SinkConfig) -> tuple[SliceWorker, RoutingProcessor]:
    """One worker and one processor per Python worker process and config, reused across tasks:
    producers, catalog connections and loaded tables outlive a single micro-batch."""
    with _EXECUTOR_LOCK:
        if key not in _EXECUTOR_STATE:
            processor = build_processor(config, load_catalog(config.catalog))
            _EXECUTOR_STATE[key] = (slice_worker(config), processor)
        return _EXECUTOR_STATE[key]


def run_task(
    key: str, config: SinkConfig, ranges: PlannedRanges, batches: Iterator[pa.RecordBatch]
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
            f"Remove the Kafka source options {', '.join(SPLITTING_OPTIONS)} if you set them."
        )
    topic, partition = str(topics[0]), int(partitions[0].as_py())
    start, end = ranges[(topic, partition)]
    worker, processor = _executor_state(key, config)
    yield SliceReport.here(worker.commit_slice(topic, partition, start, end, raw, processor)).to_batch()
