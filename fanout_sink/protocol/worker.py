"""The worker commit unit: a partition group's slices -> data files + one Kafka transaction.

A task calls it once per *step* (:mod:`.pacing`): the planned slices of a long batch go in
successive calls over sub-slices ``[s, e)`` of them, each sized to take about half the commit
interval, so every step below is one step's and every rule holds per step.

This is where invariants I1 (no gap, no overlap), I2 (events and offsets are atomic) and the
worker half of I3 (fencing) are kept. A partition group is the slices of one batch whose
partitions share a transactional id (:mod:`.partition_groups`; without packing, one partition
alone). The order of steps is the protocol:

1. Get the producer of the partition group's transactional id
   (``fanout-sink:<sink>:groups:<count>:<index>``, or ``fanout-sink:<sink>:<topic>:<partition>``
   for one partition). Creating it runs
   ``init_transactions``, which fences every older attempt holding that id, so no attempt started
   before can commit after this point. Then the layout record must still name this app's start
   (``group_layout.check_still_recorded``): an attempt of a start that a later one superseded (whose
   ids the later one fenced, not these) stops here (the rest of I3, across layouts).
2. Only then read the sink-managed group's committed offsets (``require_stable``: pending
   transactional commits are waited for). They are the truth about what was delivered, per slice:
   at or past the slice's end, nothing is left to do (nothing is read); inside the slice, only
   ``[committed, end)`` is read (or, for records handed in already read, the delivered head is
   dropped); before the slice's start, records in between were lost upstream: stop (a gap).
3. Read the source records that are left (a :data:`~.slice_writer.SliceSource` per slice), route
   and convert them (the ``SliceProcessor``), write data files (invisible until appended): the
   :class:`~.slice_writer.SliceWriter`. Slices stream through these steps one after another in
   chunks of at most ``chunk_records`` records, so a worker holds one chunk's working set whatever
   the partition group's size; append tables' rows wait for their target file size across chunks
   and slices (:mod:`.rolling_files`), a change table's chunks are announced one by one, in order.
4. One transaction: ``DataWritten`` per table, a ``DataComplete`` per slice, dead letters, and each
   slice's source offset (the planned end offset, never last record + 1: offsets have holes) sent to
   the sink group with generation -1 metadata (``recovery.send_delivered``, the one writer of the
   sink group). Commit. A crash before the commit leaves only orphan files.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence

import pyarrow as pa

from fanout_sink.errors import (
    FanoutSinkError,
    OffsetGapError,
    ProducerFencedError,
    RecordError,
    StartSupersededError,
)
from fanout_sink.faults import fault_point
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.kafka.topics import max_message_bytes, topic_ids
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, group_layout, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.slice_writer import (
    DEFAULT_CHUNK_RECORDS,
    SliceInput,
    SliceSource,
    SliceWrite,
    SliceWriter,
)
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.transform import deadletter
from fanout_sink.transform.records import SliceProcessor

log = logging.getLogger(__name__)


class SliceWorker:
    """Commits slices for one sink; cheap to reuse (one producer per transactional id, cached).

    A lock per transactional id keeps two threads of one process from sharing a transaction. A
    producer that is fenced is dropped. If it was created for this very slice, the attempt is a
    zombie and stops (``ProducerFencedError``). If it was cached from an earlier slice, another
    process ran the partition in between (a moved task): the slice starts over once with a new
    producer. Either way the stable offset read after fencing decides what is left to deliver.
    """

    def __init__(
        self,
        channel: SinkChannel,
        dead_letter_topic: str | None = None,
        max_files_per_event: int = 100,
        file_age_limit_s: float | None = None,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
    ) -> None:
        """``max_files_per_event``, ``file_age_limit_s`` and ``chunk_records``: how slices are
        written (:class:`~.slice_writer.SliceWriter`)."""
        self.channel = channel
        self.writer = SliceWriter(channel, max_files_per_event, file_age_limit_s, chunk_records)
        self.sink = channel.sink
        self.control_topic = channel.control_topic
        self.dead_letter_topic = dead_letter_topic
        self.sink_group = channel.sink_group
        self.timeout_s = channel.timeout_s
        self._group_metadata: bytes | None = None
        self._producers: dict[str, TransactionalProducer] = {}
        self._committed_to: dict[str, dict[tuple[str, int], int]] = {}
        """Per transactional id and partition, the end offset of the last slice its cached producer
        committed."""
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._offsets: GroupOffsets | None = None
        self._control_checked = False
        self._dead_letter_max_bytes: int | None = None

    def committed_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """The sink-managed group's stable committed offsets, in one request."""
        with self._guard:
            if self._offsets is None:
                self._offsets = GroupOffsets(self.channel.clients, self.sink_group, stable=True)
            return self._offsets.committed(partitions)

    def _sink_group_metadata(self) -> bytes:
        if self._group_metadata is None:
            self._group_metadata = recovery.sink_group_metadata(self.channel)
        return self._group_metadata

    def _dead_letter_limit(self, topic: str) -> int:
        """The dead-letter topic's message size limit, asked once per process."""
        if self._dead_letter_max_bytes is None:
            self._dead_letter_max_bytes = max_message_bytes(self.channel.clients, topic)
        return self._dead_letter_max_bytes

    def _lock(self, txn_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(txn_id, threading.Lock())

    def _producer(self, txn_id: str, slices: str) -> TransactionalProducer:
        producer = self._producers.get(txn_id)
        if producer is None:
            limits = [self.writer.control_limit()]
            if self.dead_letter_topic is not None:
                limits.append(self._dead_letter_limit(self.dead_letter_topic))
            producer = TransactionalProducer(
                self.channel.clients,
                txn_id,
                batch_bytes=min(limits),
                fenced_message=(
                    f"the transaction for {slices} was fenced: a newer attempt for these partitions "
                    f"(transactional id {txn_id!r}) took over. This attempt stops; the newer one "
                    "delivers the records."
                ),
            )
            try:
                group_layout.check_still_recorded(self.channel)
            except StartSupersededError:
                producer.flush()
                raise
            self._producers[txn_id] = producer
        return producer

    def commit_slice(
        self, planned: Slice, source: pa.Table | SliceSource, process: SliceProcessor
    ) -> SliceResult:
        """Deliver one source partition's planned range: a partition group of one slice
        (:meth:`commit_partition_group`)."""
        return self.commit_partition_group([(planned, source)], process)[0]

    def commit_partition_group(
        self,
        work: Sequence[tuple[Slice, pa.Table | SliceSource]],
        process: SliceProcessor,
        continuing: bool = False,
    ) -> list[SliceResult]:
        """Deliver the planned offset ranges ``[start, end)`` of a partition group's slices in one
        transaction; one result per slice, in the order given.

        The slices' partitions must share one transactional id (one partition group of the
        channel's :class:`~.partition_groups.PartitionGroups`). Each source reads the slice's records
        when the worker knows what is left; a table of the range's records already read (tests,
        tools) is taken as it is and its delivered head dropped. Slices without a ``topic_id`` get it
        from the broker. ``continuing``: an earlier step of the same task committed with this
        process's producer (:mod:`.pacing`), so it is kept even for partitions it never committed.
        """
        work = self._with_topic_ids(work)
        txn_ids = {self.channel.worker_transactional_id(p.topic, p.partition) for p, _ in work}
        if len(txn_ids) != 1:
            raise ValueError(f"a partition group's slices share one transactional id, not {sorted(txn_ids)}")
        txn_id = txn_ids.pop()
        if not self._control_checked:
            # Producing to a missing topic only times out; creating or checking it once says why.
            channel.ensure_control_topic(self.channel)
            self._control_checked = True
        with self._lock(txn_id):
            ends = self._committed_to.setdefault(txn_id, {})
            stale = not continuing and not self._continues(ends, [p for p, _ in work])
            if txn_id in self._producers and stale:
                # Another process delivered the partition group in between (Spark ran its last task in
                # another Python worker): its producer fenced the cached one, which would only find out
                # at the transaction, after the slices' work. Start with a new one.
                self._producers.pop(txn_id)
            cached = txn_id in self._producers
            try:
                results = self._attempt(txn_id, work, process)
            except ProducerFencedError:
                if not cached:
                    raise
                # The cached producer was fenced since its last use: the partition group ran in another
                # process meanwhile (Spark moved the task). That is not a zombie situation, so start
                # over once with a new producer, which fences in turn and re-reads the offsets.
                log.info("cached producer %s was fenced since its last use; retrying with a new one", txn_id)
                results = self._attempt(txn_id, work, process)
            for result in results:
                if result.transaction_committed:
                    ends[(result.slice.topic, result.slice.partition)] = result.slice.end
            return results

    @staticmethod
    def _continues(ends: dict[tuple[str, int], int], slices: list[Slice]) -> bool:
        """Whether the cached producer's last commits end where these slices start: a partition it
        committed that does not go on from its last end was delivered by another process since, and
        a producer that never committed any of them cannot be trusted either."""
        known = [(ends[(s.topic, s.partition)], s.start) for s in slices if (s.topic, s.partition) in ends]
        return bool(known) and all(end == start for end, start in known)

    def _with_topic_ids(
        self, work: Sequence[tuple[Slice, pa.Table | SliceSource]]
    ) -> list[tuple[Slice, pa.Table | SliceSource]]:
        missing = {p.topic for p, _ in work if p.topic_id is None}
        if not missing:
            return list(work)
        ids = topic_ids(self.channel.clients, sorted(missing))
        return [
            (p if p.topic_id is not None else dataclasses.replace(p, topic_id=ids.get(p.topic)), source)
            for p, source in work
        ]

    def _attempt(
        self, txn_id: str, work: list[tuple[Slice, pa.Table | SliceSource]], process: SliceProcessor
    ) -> list[SliceResult]:
        # A new producer fences older attempts before anything is read.
        producer = self._producer(txn_id, ", ".join(p.label for p, _ in work))
        delivered = self.committed_offsets([(p.topic, p.partition) for p, _ in work])
        lost = [p for p, _ in work if delivered[(p.topic, p.partition)] is None]
        if lost:  # expired while the app ran, the partitions' first slices, or recreated topics
            delivered.update(
                recovery.restore_in_slices(self.channel, producer, self._sink_group_metadata(), lost)
            )
        results: list[SliceResult] = []
        parts: list[SliceInput] = []
        for planned, source in work:
            committed = delivered[(planned.topic, planned.partition)]
            result = SliceResult(planned, committed)
            results.append(result)
            if committed is not None and committed >= planned.end:
                # Nothing is read; records handed in already read were all delivered.
                result.skipped_delivered = result.records_in = 0 if callable(source) else source.num_rows
                continue
            if committed is not None and committed < planned.start:
                raise OffsetGapError(
                    planned.topic, planned.partition, committed, planned.start, planned.end, self.sink_group
                )
            parts.append(SliceInput(planned, source, committed, result))
        if not parts:
            return results
        try:
            written = self.writer.write(parts, process)
        except RecordError as exc:
            raise _restart_named(exc, parts) from None
        self._commit(txn_id, producer, parts, written)
        for part in parts:
            part.result.transaction_committed = True
        return results

    def _commit(
        self, txn_id: str, producer: TransactionalProducer, parts: list[SliceInput], written: SliceWrite
    ) -> None:
        """The partition group's one transaction: its events, a ``DataComplete`` per slice, dead
        letters and offsets."""
        dead_letter_topic = self.dead_letter_topic
        first = parts[0].planned
        if written.dead_letters and dead_letter_topic is None:
            bad = written.dead_letters[0]
            raise FanoutSinkError(
                f"{len(written.dead_letters)} record(s) of {', '.join(str(p.planned) for p in parts)} could "
                f"not be delivered and no dead-letter topic is configured (first: headers {bad.headers}).\n"
                "  fix: configure dead-letter.topic, or fix the records / routes."
            )
        try:
            with producer.transaction():
                for event in written.events:
                    channel.produce_event(producer, self.control_topic, self.sink, event)
                for part in parts:
                    planned = part.planned
                    oldest_ms, newest_ms = written.timestamps(planned)
                    complete = ev.DataComplete(
                        topic=planned.topic,
                        partition=planned.partition,
                        next_offset=planned.end,
                        min_timestamp_ms=oldest_ms,
                        max_timestamp_ms=newest_ms,
                        topic_id=planned.topic_id,
                    )
                    channel.produce_event(producer, self.control_topic, self.sink, complete)
                if written.dead_letters and dead_letter_topic is not None:
                    # Cut to size: one oversized dead letter would fail this transaction on every retry.
                    limit = self._dead_letter_limit(dead_letter_topic)
                    deadletter.publish(producer, dead_letter_topic, written.dead_letters, limit)
                ends = {(p.planned.topic, p.planned.partition): p.planned.end for p in parts}
                recovery.send_delivered(producer, self._sink_group_metadata(), ends)
                fault_point("worker.before-commit", topic=first.topic, partition=first.partition)
        finally:
            if not producer.usable:  # the next attempt's producer fences this one
                self._producers.pop(txn_id, None)
        fault_point("worker.after-commit", topic=first.topic, partition=first.partition)

    def close(self) -> None:
        """Flush and drop the cached producers (an open transaction, if any, times out and aborts)."""
        for producer in self._producers.values():
            producer.flush(self.timeout_s)
        self._producers.clear()
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None


def _restart_named(error: RecordError, parts: list[SliceInput]) -> RecordError:
    """``error`` saying where a restart reads its partition again: nothing of the partition group
    was committed, so from the sink group's offset, or the slice's start when it holds none."""
    for part in parts:
        if (part.planned.topic, part.planned.partition) == (error.topic, error.partition):
            if part.committed is None:
                return error.restarting_at(part.planned.start, committed=False)
            return error.restarting_at(part.committed, committed=True)
    return error
