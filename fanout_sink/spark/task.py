"""The executor side of a micro-batch: one Spark task delivers one partition group's ranges.

The driver hands each task the planned :class:`~fanout_sink.protocol.slices.Slice` s of one
partition group (an RDD element, never Kafka rows: the micro-batch DataFrame of Spark's Kafka
source is never executed). The task's worker fences, reads the delivered offsets, and only then
reads what is left of each range with librdkafka
(:class:`~fanout_sink.kafka.range_reader.RangeReader`, the group's partitions in one assignment)
straight into Arrow, one slice after another, in one transaction. What it did travels back to the
driver as a pickled :class:`SliceReport` per slice.

``FANOUT_SINK_PROFILE=<dir>`` (in the app's environment, which local executors inherit) runs every
task under cProfile (wall clock, its default: waits on the broker show too) and dumps
``<dir>/<topic>-<partition>-<batch>.prof``, named after the group's first slice (``python -m
pstats`` reads it).
"""

from __future__ import annotations

import cProfile
import functools
import gc
import hashlib
import os
import resource
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fanout_sink import logs
from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform.processor import RoutingProcessor, build_processor

PROFILE_ENV = "FANOUT_SINK_PROFILE"


@dataclass(frozen=True)
class SliceReport:
    """One slice as the driver sees it: the worker's result and the peak memory of the executor's
    Python worker process that ran it."""

    result: SliceResult
    peak_rss_mb: int

    @classmethod
    def here(cls, result: SliceResult) -> SliceReport:
        return cls(result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)


def config_key(config: SinkConfig) -> str:
    """Identifies a config across tasks, so executor state built for one is never used for another."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def slice_worker(config: SinkConfig) -> SliceWorker:
    # The smallest safety age any table's orphan cleanup may use: a slice's files must be announced
    # well within it.
    ages = [config.maintenance, *(t.maintenance for t in config.tables.values() if t.maintenance)]
    return SliceWorker(
        SinkChannel.from_config(config),
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
        file_age_limit_s=min(m.orphan_older_than for m in ages).total_seconds(),
        chunk_records=config.spark.max_records_per_batch,
    )


@dataclass(frozen=True)
class _ExecutorState:
    worker: SliceWorker
    processor: RoutingProcessor
    reader: RangeReader


_EXECUTOR_STATE: dict[str, _ExecutorState] = {}
_EXECUTOR_LOCK = threading.Lock()


def _executor_state(key: str, config: SinkConfig) -> _ExecutorState:
    """One worker, processor and source reader per Python worker process and config, reused across
    tasks: producers, the consumer, catalog connections and loaded tables outlive a micro-batch."""
    with _EXECUTOR_LOCK:
        if key not in _EXECUTOR_STATE:
            # The executor's lines join the driver's (local) or the executor's log (cluster): alike.
            logs.configure(config.logging.format, config.logging.level)
            processor = build_processor(config, load_catalog(config.catalog))
            channel = SinkChannel.from_config(config)
            reader = RangeReader(channel.clients, channel.sink_group)
            _EXECUTOR_STATE[key] = _ExecutorState(slice_worker(config), processor, reader)
            freeze_long_lived()
        return _EXECUTOR_STATE[key]


def freeze_long_lived() -> None:
    """Move the process's long-lived objects out of the cyclic garbage collector's reach.

    A slice allocates millions of short-lived container objects (a ``Message`` and a timestamp
    tuple per record), which trigger collections; each full one walked every object the imports
    and the executor state had left (modules, pydantic models, the catalog): 1.3 of the 2.5 CPU
    seconds a worker spent reading 1M records (docs/benchmarks/cpu.md). Frozen objects are never
    walked nor collected: garbage is collected first, and only what exists once the state is
    built is frozen, so later cycles are still collected.
    """
    gc.collect()
    gc.freeze()


def run_task(
    key: str,
    config: SinkConfig,
    batch_id: int,
    unknown_schema_ids: dict[int, float],
    groups: Iterable[list[Slice]],
) -> Iterator[SliceReport]:
    """One Spark task = one partition group's slices of the micro-batch (one element), each with the
    topic's id the driver asked when it planned the batch; a report per slice.
    ``unknown_schema_ids``: ids earlier tasks found unknown to the Schema Registry, with when first
    seen (the timeout of an id runs from then, whichever process saw it)."""
    state = _executor_state(key, config)
    if unknown_schema_ids:
        from fanout_sink.transform.formats.registry import RegistryDecoder

        if isinstance(state.processor.decoder, RegistryDecoder):
            state.processor.decoder.seen_since(unknown_schema_ids)
    profile_dir = os.environ.get(PROFILE_ENV)
    for group in groups:
        # Chunks, not whole ranges: the task's memory holds one chunk's working set.
        work = [
            (
                planned,
                functools.partial(
                    state.reader.read_chunks,
                    planned.topic,
                    planned.partition,
                    max_records=state.worker.writer.chunk_records,
                ),
            )
            for planned in group
        ]
        deliver = functools.partial(state.worker.commit_partition_group, work, state.processor)
        # The group's partitions in one assignment, each resumed for its range (a new assignment per
        # range cost ~1 s per one-partition topic), small ranges fetched ahead (issue 32).
        ranges = [(planned.topic, planned.partition, planned.start, planned.end) for planned in group]
        with state.reader.assigned(ranges):
            if profile_dir:
                profiler = cProfile.Profile()
                results = profiler.runcall(deliver)
                Path(profile_dir).mkdir(parents=True, exist_ok=True)
                first = group[0]
                name = f"{first.topic}-{first.partition}-{batch_id}.prof"
                profiler.dump_stats(Path(profile_dir) / name)
            else:
                results = deliver()
        for result in results:
            yield SliceReport.here(result)
