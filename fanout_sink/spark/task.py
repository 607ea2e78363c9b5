"""The executor side of a micro-batch: one Spark task delivers one partition group's ranges (or
``spark.groups-per-task`` groups', one thread each, so that one Python worker process serves them).

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fanout_sink.protocol.pacing import deliver_in_steps
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.spark.executor_context import Delivery, TaskSetup, executor_context

if TYPE_CHECKING:
    from fanout_sink.transform.formats.registry import RegistryDecoder

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
    """One Spark task = the slices of one partition group of the micro-batch (one element), or of
    up to ``spark.groups-per-task`` groups, each on a thread of its own (a lane of this Python
    worker process's :class:`~.executor_context.Delivery`, built by its first task); each slice with
    the topic's id the driver asked when it planned the batch; a report per slice, in the groups'
    order. Every group is its own commit unit as with one group a task: its own consumer assignment,
    transactional producer and steps, so a group's transaction covers exactly its slices and
    offsets, and a killed process leaves each group's open transaction to the next attempt's
    fencing. A group that fails fails the task once every group's thread has ended (the others'
    commits stand: a retry skips what they delivered). ``unknown_schema_ids``: ids earlier tasks
    found unknown to the Schema Registry, with when first seen (the timeout of an id runs from then,
    whichever process saw it); the reports name those the registry has served this process since."""
    groups = list(partition_groups)
    context = executor_context(setup)
    lanes = [context.delivery(lane) for lane in range(max(1, len(groups)))]
    registries = _registries(lanes) if unknown_schema_ids else []
    for registry in registries:
        registry.seen_since(unknown_schema_ids)
    if len(groups) <= 1:
        delivered = [_deliver_group(lanes[0], slices, batch_id) for slices in groups]
    else:
        with ThreadPoolExecutor(len(groups), thread_name_prefix="fanout-sink-group") as pool:
            futures = [
                pool.submit(_deliver_group, lane, group, batch_id)
                for lane, group in zip(lanes, groups, strict=True)
            ]
        # Leaving the pool waited for every group's thread: a failed group's error is raised only
        # once no thread of this task reads or commits any more.
        delivered = [future.result() for future in futures]
    served = tuple(sorted({i for r in registries for i in r.served(list(unknown_schema_ids))}))
    for results in delivered:
        for result in results:
            yield SliceReport.here(result, served)


def _registries(lanes: list[Delivery]) -> list[RegistryDecoder]:
    """The lanes' Schema Registry decoders (none unless the source's format is registry-encoded)."""
    from fanout_sink.transform.formats.registry import RegistryDecoder

    return [lane.processor.decoder for lane in lanes if isinstance(lane.processor.decoder, RegistryDecoder)]


def _deliver_group(state: Delivery, slices: list[Slice], batch_id: int) -> list[SliceResult]:
    """One partition group's slices delivered in steps with ``state``'s reader and processor."""
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
    profile_dir = os.environ.get(PROFILE_ENV)
    with state.reader.assigned(ranges):
        if not profile_dir:
            return deliver()
        profiler = cProfile.Profile()
        results: list[SliceResult] = profiler.runcall(deliver)
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        first = slices[0]
        profiler.dump_stats(Path(profile_dir) / f"{first.topic}-{first.partition}-{batch_id}.prof")
        return results
