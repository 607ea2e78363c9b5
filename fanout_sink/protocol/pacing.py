"""Paced transactions: a partition group's planned slices delivered in steps of about a set duration.

A micro-batch may plan a whole backlog (``spark.max-offsets-per-trigger`` unset: Spark plans
everything there is). Delivered in one transaction, no table would see any of it until the batch
ended, minutes later. Instead a task delivers its partition group in *steps*: successive
:meth:`~.worker.SliceWorker.commit_partition_group` calls over sub-slices ``[s, e)`` of the planned
slices, each sized to take about :func:`step_target_s` (half of ``control.commit-interval``). Each
step is an ordinary commit unit, so every rule of the worker holds per step: it fences, reads the
sink group's stable offsets, reads ``[max(committed, s), e)``, writes files and commits one
transaction with ``DataComplete(next_offset=e)`` and the sink-group offset ``e``. The coordinator's
rounds (every interval) commit what the steps reported meanwhile, so every table is committed at
least every two intervals while its task runs. A partition's last step ends at the planned end;
a sub-slice's end is an offset like any planned end (holes are fine: the next step reads from it).

A step is sized in offsets: the Python worker process's measured rate times the target. The rate is
kept per process (:class:`StepPacer`, one per executor context), across tasks and batches, smoothed;
before anything is measured a step is :data:`FIRST_STEP_CHUNKS` chunks. Slices are taken whole while
they fit, so a partition group of many small ranges (fan-out) still goes in one step. The task keeps
one reader assignment around all of its steps (``spark/task.py``).

The driver keeps its bookkeeping per planned slice: :func:`deliver_in_steps` merges the steps'
results into one :class:`~.slices.SliceResult` per planned slice.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence

from fanout_sink.faults import fault_point
from fanout_sink.protocol.slice_writer import SliceSource
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform.records import SliceProcessor

log = logging.getLogger(__name__)

STEP_SHARE = 0.5
"""A step's target duration as a share of ``control.commit-interval``: a round every interval then
finds at least one new step of each running task, and a record waits at most a step plus an interval."""

MIN_STEP_S = 1.0
"""A step's target at least this long, whatever the interval: a step's own cost (fencing check,
offsets read, transaction, files closed) stays a small share of it."""

MAX_STEP_S = 60.0
"""A step's target at most this long: with a long interval, a stop or a crash repeats at most this."""

FIRST_STEP_CHUNKS = 4
"""Before a process has measured its rate, a step is this many chunks (``spark.max-records-per-batch``)."""

GROWTH = 4.0
"""A step at most this many times the previous one: a rate measured on a few records is noisy."""

SMOOTHING = 0.5
"""Weight of the newest step's rate in the smoothed rate (exponential moving average)."""

TAIL_SHARE = 0.25
"""A cut that would leave less than this share of a step of a slice takes the rest along instead."""


def step_target_s(commit_interval_s: float) -> float:
    """The target duration of one step for ``control.commit-interval``."""
    return min(MAX_STEP_S, max(MIN_STEP_S, commit_interval_s * STEP_SHARE))


class StepPacer:
    """Sizes steps for one Python worker process from its measured rate (offsets per second);
    shared by the process's tasks and kept across batches."""

    def __init__(self, target_s: float, chunk_records: int) -> None:
        self.target_s = target_s
        self.chunk_records = max(1, chunk_records)
        self.rate: float | None = None
        """Offsets delivered per second, smoothed; ``None`` until a step has read something."""
        self._last = FIRST_STEP_CHUNKS * self.chunk_records
        self._lock = threading.Lock()

    def budget(self) -> int:
        """Offsets the next step should cover: rate x target, at least one chunk, growing at most
        :data:`GROWTH` times from the previous step's."""
        with self._lock:
            if self.rate is None:
                return self._last
            wanted = int(self.rate * self.target_s)
            return max(self.chunk_records, min(wanted, int(self._last * GROWTH)))

    def measured(self, offsets: int, seconds: float) -> None:
        """A step delivered ``offsets`` (read, not skipped) in ``seconds``."""
        if offsets <= 0 or seconds <= 0:
            return
        with self._lock:
            rate = offsets / seconds
            self.rate = rate if self.rate is None else SMOOTHING * rate + (1 - SMOOTHING) * self.rate
            self._last = max(self._last, offsets)


def next_step(remaining: Sequence[Slice], budget: int) -> tuple[list[Slice], list[Slice]]:
    """The sub-slices of the next step (about ``budget`` offsets, at least one offset), and what is
    left after it, in the given order: whole slices while they fit, the slice that does not is cut
    (unless its rest after the cut would be a small tail)."""
    step: list[Slice] = []
    left = max(1, budget)
    for index, planned in enumerate(remaining):
        size = planned.end - planned.start
        if size <= left or size - left < TAIL_SHARE * budget:
            step.append(planned)
            left -= size
            if left > 0:
                continue
            return step, list(remaining[index + 1 :])
        if step and left < TAIL_SHARE * budget:  # not worth a cut: the slice starts the next step
            return step, list(remaining[index:])
        cut = planned.start + left
        step.append(dataclasses.replace(planned, end=cut))
        return step, [dataclasses.replace(planned, start=cut), *remaining[index + 1 :]]
    return step, []


def deliver_in_steps(
    worker: SliceWorker,
    work: Sequence[tuple[Slice, SliceSource]],
    process: SliceProcessor,
    pacer: StepPacer,
) -> list[SliceResult]:
    """Deliver a partition group's planned slices in steps, each one transaction; one merged result
    per planned slice, in the order given. ``work``: each planned slice with its partition's source,
    which reads any ``[from, until)`` of it (each step reads its sub-slice)."""
    sources = {(planned.topic, planned.partition): source for planned, source in work}
    planned_slices = [planned for planned, _ in work]
    steps: dict[tuple[str, int], list[SliceResult]] = {key: [] for key in sources}
    remaining = planned_slices
    count = 0
    committed = False
    while remaining:
        step, remaining = next_step(remaining, pacer.budget())
        if count:
            first = step[0]
            fault_point("worker.between-steps", topic=first.topic, partition=first.partition, step=count)
        started = time.monotonic()
        # After a step this task committed, the cached producer is current (another process taking
        # the id over would have fenced it, and its commit would say so): a step of a partition it
        # never committed keeps it, instead of a new producer's init_transactions.
        results = worker.commit_partition_group(
            [(s, sources[(s.topic, s.partition)]) for s in step], process, continuing=committed
        )
        committed = committed or any(r.transaction_committed for r in results)
        seconds = time.monotonic() - started
        offsets = sum(_offsets_read(r) for r in results)
        pacer.measured(offsets, seconds)
        count += 1
        log.debug(
            "step %d of %s: %d offsets in %.2fs (next about %d)",
            count,
            ", ".join(s.label for s in step[:3]) + (" ..." if len(step) > 3 else ""),
            offsets,
            seconds,
            pacer.budget(),
        )
        for result in results:
            steps[(result.slice.topic, result.slice.partition)].append(result)
    return [merged(planned, steps[(planned.topic, planned.partition)]) for planned in planned_slices]


def _offsets_read(result: SliceResult) -> int:
    """Offsets a step's slice read (its delivered head skipped): what its time was spent on."""
    if not result.transaction_committed:
        return 0
    start = (
        result.slice.start
        if result.committed_before is None
        else max(result.slice.start, result.committed_before)
    )
    return max(0, result.slice.end - start)


def merged(planned: Slice, results: Sequence[SliceResult]) -> SliceResult:
    """One result for a planned slice from its steps' results: counts summed, committed if any step
    committed, the delivered offset as the first step found it."""
    total = SliceResult(planned, results[0].committed_before if results else None)
    rows: Counter[str] = Counter()
    files: Counter[str] = Counter()
    deleted: Counter[str] = Counter()
    for result in results:
        total.records_in += result.records_in
        total.skipped_delivered += result.skipped_delivered
        total.dead_lettered += result.dead_lettered
        total.filtered += result.filtered
        total.transaction_committed = total.transaction_committed or result.transaction_committed
        rows.update(result.rows)
        files.update(result.files)
        deleted.update(result.deleted_keys)
    total.rows, total.files, total.deleted_keys = dict(rows), dict(files), dict(deleted)
    return total
