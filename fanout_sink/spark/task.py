"""The executor side of a micro-batch: one Spark task delivers one partition group's ranges.

The driver hands each task the planned :class:`~fanout_sink.protocol.slices.Slice` s of one
partition group (an RDD element, never Kafka rows: the micro-batch DataFrame of Spark's Kafka
source is never executed). The task's worker fences, reads the delivered offsets, and only then
reads what is left of each range with librdkafka
(:class:`~fanout_sink.kafka.range_reader.RangeReader`, the group's partitions in one assignment)
straight into Arrow, one slice after another, in steps of about half the commit interval, each one
transaction (:mod:`fanout_sink.protocol.pacing`), all inside that one assignment. What it did
travels back to the driver as a pickled :class:`SliceReport` per planned slice (its steps merged).

``FANOUT_SINK_PROFILE=<dir>`` (in the app's environment, which local executors inherit) runs every
task under cProfile (wall clock, its default: waits on the broker show too) and dumps
``<dir>/<topic>-<partition>-<batch>.prof``, named after the group's first slice (``python -m
pstats`` reads it).
"""

from __future__ import annotations

import cProfile
import functools
import os
import resource
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fanout_sink.protocol.pacing import deliver_in_steps
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.spark.executor_context import TaskSetup, executor_context

PROFILE_ENV = "FANOUT_SINK_PROFILE"


@dataclass(frozen=True)
class SliceReport:
    """One slice as the driver sees it: the worker's result and the peak memory of the executor's
    Python worker process that ran it."""

    result: SliceResult
    peak_rss_mb: int
    schema_ids_served: tuple[int, ...] = ()
    """Of the ids the driver handed the task as unknown, those the registry has served its process:
    they leave the driver's record (:class:`~fanout_sink.transform.formats.unknown_ids.UnknownSchemaIds`)."""

    @classmethod
    def here(cls, result: SliceResult, schema_ids_served: tuple[int, ...] = ()) -> SliceReport:
        return cls(result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, schema_ids_served)


def run_task(
    setup: TaskSetup,
    batch_id: int,
    unknown_schema_ids: dict[int, float],
    partition_groups: Iterable[list[Slice]],
) -> Iterator[SliceReport]:
    """One Spark task = one partition group's slices of the micro-batch (one element), each with the
    topic's id the driver asked when it planned the batch; a report per slice, delivered with this
    Python worker process's :class:`~.executor_context.Delivery` (built by its first task).
    ``unknown_schema_ids``: ids earlier tasks found unknown to the Schema Registry, with when first
    seen (the timeout of an id runs from then, whichever process saw it); the reports name those the
    registry has served this process since."""
    state = executor_context(setup).delivery()
    registry = None
    if unknown_schema_ids:
        from fanout_sink.transform.formats.registry import RegistryDecoder

        if isinstance(state.processor.decoder, RegistryDecoder):
            registry = state.processor.decoder
            registry.seen_since(unknown_schema_ids)
    profile_dir = os.environ.get(PROFILE_ENV)
    for slices in partition_groups:
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
            for planned in slices
        ]
        deliver = functools.partial(deliver_in_steps, state.worker, work, state.processor, state.pacer)
        # The partition group's partitions in one assignment, each resumed for its range (a new assignment per
        # range cost ~1 s per one-partition topic), small ranges fetched ahead (issue 32).
        ranges = [(planned.topic, planned.partition, planned.start, planned.end) for planned in slices]
        with state.reader.assigned(ranges):
            if profile_dir:
                profiler = cProfile.Profile()
                results = profiler.runcall(deliver)
                Path(profile_dir).mkdir(parents=True, exist_ok=True)
                first = slices[0]
                name = f"{first.topic}-{first.partition}-{batch_id}.prof"
                profiler.dump_stats(Path(profile_dir) / name)
            else:
                results = deliver()
        served = tuple(registry.served(list(unknown_schema_ids))) if registry is not None else ()
        for result in results:
            yield SliceReport.here(result, served)
