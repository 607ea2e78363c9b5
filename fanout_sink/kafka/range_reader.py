"""Reads one source partition's planned offset range ``[start, end)`` straight into Arrow.

Spark plans the micro-batch (end offsets, checkpoint, triggers), but its Kafka source is never
executed: the records would cross the JVM, become Spark rows, then Arrow again on their way to the
Python task, which cost most of the sink's CPU. The task reads its range itself with librdkafka:

- ``read_committed``: aborted records and transaction markers never appear, so offsets have holes
  and the range cannot end at "last record + 1". It ends at the first message at or past ``end``,
  or at partition EOF at or past ``end`` (the last stable offset: markers and aborted records at
  the tail of the range are passed that way).
- Assigned, never subscribed, no commits: the consumer's group id is the sink group's, which must
  never get a member (``KafkaClientFactory.group_metadata``); assigning does not join.
- A start below the log start is data loss (``auto.offset.reset: error``), the same condition
  Spark's ``failOnDataLoss=true`` stopped on; no progress for ``stall_timeout_s`` is an error too.
- Each ``consume`` batch becomes Arrow record batches (:mod:`fanout_sink.kafka.consumed`): copied
  from librdkafka's messages in C by the native consume where it is built
  (:mod:`fanout_sink.kafka.native_consume`, about a fifth of the CPU per record), else from
  confluent-kafka's ``Message`` objects, a Python list per column; which one is logged once.
- ``read_chunks`` hands the range out in tables of at most ``max_records`` records, so a worker's
  memory holds a chunk's working set, not the whole slice (issue 26); ``read`` is all of it at once.
- ``assigned`` holds a partition group's partitions in one assignment, paused, while a task reads
  their ranges one after another: a range then starts by resuming its partition, not by a new
  assignment, whose first fetch waited about a second per partition of a topic the consumer had not
  been assigned before (each of a whole database's one-partition topics, issue 32).
- Inside ``assigned`` a read that ends inside its partition's planned range (a step of a paced task)
  leaves the partition fetching when exactly the records before its end were handed out: the next
  step reads on from the queue instead of seeking and waiting for a fresh fetch (~0.9 s a step).
- Inside ``assigned`` the small ranges to be read next are fetched ahead, resumed together while
  the current one is read, their records kept per partition until their turn: read one after
  another, each small range waited for a fetch of its own (~40 ms, three quarters of a 5,000-partition
  batch's wall time, py-spy), while one fetch brings hundreds of partitions' records at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fanout_sink.errors import SourceDataLossError, SourceReadError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.consumed import (
    RAW_RECORD_SCHEMA,
    Consumed,
    PartitionKey,
    last_offset,
    within,
)
from fanout_sink.kafka.native_consume import choose_consume

__all__ = ["RAW_RECORD_SCHEMA", "RangeReader"]

FETCH_DEFAULTS: dict[str, Any] = {
    # One partition per consumer: let one fetch bring a good chunk of it (librdkafka's default is 1 MB
    # per partition per fetch), and keep up to 8 MB queued ahead of consume(). A worker's memory grows
    # with these: reading 500,000 records peaked at 313 MB above the imports with 64 MB (and 32 MB per
    # partition), 174 MB with 8 MB, at the same read time (docs/benchmarks/memory.md).
    "fetch.max.bytes": 8 * 1024 * 1024,
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
    "queued.max.messages.kbytes": 8 * 1024,
    # A range read to its end leaves a fetch waiting at the broker for new records; the next range's
    # first fetch (another partition: the next slice) goes out only when that one returns, so with
    # librdkafka's 500 ms every slice began by waiting out about half a second (the largest part of
    # a small slice's cost). Inside a range the records are there and fetches return at once.
    "fetch.wait.max.ms": 10,
    # Once the queue holds queued.max.messages.kbytes, librdkafka puts the partition's next fetch off
    # by this long (its default: 1000 ms). A range's last offset is often a transaction marker, never
    # delivered, so its read ends on the partition EOF that only the next fetch brings: with the
    # default every range that filled the queue waited ~1 s at its end (0.93 s measured; a 10M-record
    # run's batches 2.6 s, the machine ~40 % idle). 10 ms keeps the queue's bound and drops the wait.
    "fetch.queue.backoff.ms": 10,
}
"""Fetch sizes for reading whole ranges; the user's ``kafka:`` section wins where it sets one."""


def fetch_defaults(conf: Mapping[str, Any]) -> dict[str, Any]:
    """:data:`FETCH_DEFAULTS` for a ``kafka:`` section: a ``fetch.max.bytes`` below the section's
    ``message.max.bytes`` makes librdkafka refuse to create the consumer, so it is raised to it."""
    largest = int(conf.get("message.max.bytes", 0))
    return {**FETCH_DEFAULTS, "fetch.max.bytes": max(int(FETCH_DEFAULTS["fetch.max.bytes"]), largest)}


RANGE_CONSUMER: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    # A start below the log start is an error (ERR__AUTO_OFFSET_RESET), never a jump.
    "auto.offset.reset": "error",
}
"""What a range reader's consumer always is, whatever the ``kafka:`` section says: it reads committed
records only, never commits, and sees the partition's end (a range's tail may be a marker)."""


CONSUME_BATCH = 10_000
"""Messages per ``consume`` call, so per Arrow record batch."""

CONSUME_WAIT_S = 0.2
"""How long one ``consume`` call waits for its count; the stall timeout bounds the whole read."""

DEFAULT_STALL_TIMEOUT_S = 60.0

AHEAD_RECORDS = 50_000
"""Records (offsets planned) of the ranges fetched ahead at once, at most: what a reader inside
``assigned`` holds beyond the range it reads, as Arrow (~10 MB of JSON records). A larger range is
read on its own turn."""

AHEAD_PARTITIONS = 500
"""Ranges fetched ahead at once, at most: one fetch request names every resumed partition."""

REFILL_SHARE = 0.5
"""The ranges fetched ahead are topped up once they are down to this share of both budgets, not after
every range read: ``resume`` waits for each partition's broker thread to take the op, so a call per
range (one range popped, the next resumed) cost ~5 % of a 5,000-partition batch's worker CPU; a call
per half window resumes ~250 partitions at once."""


@dataclass
class _Ahead:
    """A range fetched ahead of its turn: its partition resumed at ``start``, its records kept."""

    start: int
    end: int
    batches: list[pa.RecordBatch] = field(default_factory=list)
    position: int = field(init=False)
    """Where the range's records are known up to: past the last one kept, or an EOF's offset."""

    def __post_init__(self) -> None:
        self.position = self.start

    @property
    def complete(self) -> bool:
        return self.position >= self.end


class RangeReader:
    """One consumer, reassigned for every range it reads (or once per partition group, in
    :meth:`assigned`); cheap to keep per process and sink.

    ``group`` is the sink group's id, used only because librdkafka needs one (and named in errors):
    the consumer never joins, subscribes or commits. ``read`` holds a lock, so threads of one
    process take turns on the single assignment; a thread inside :meth:`assigned` holds it until its
    ranges are done.
    """

    def __init__(
        self, clients: KafkaClientFactory, group: str, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    ) -> None:
        self.group = group
        self.stall_timeout_s = stall_timeout_s
        self._lock = threading.RLock()
        self._assignment: list[TopicPartition] = []
        """Inside :meth:`assigned`: the assigned partitions at their starts; empty outside."""
        self._paused: dict[tuple[str, int], int | None] | None = None
        """Inside :meth:`assigned`: each assigned partition and the offset it would be fetched
        from when resumed (``None``: unknown, so a read seeks first); ``None`` outside."""
        self._failed = False
        """A read inside :meth:`assigned` failed: the next read assigns them all afresh, at its own start."""
        self._plan: list[tuple[tuple[str, int], int, int]] = []
        """Inside :meth:`assigned`: the ranges in the order they will be read."""
        self._planned = 0
        """How many of ``_plan`` were taken for reading or fetching ahead."""
        self._planned_end: dict[tuple[str, int], int] = {}
        """Inside :meth:`assigned`: each partition's last planned end (:meth:`_goes_on_at` asks per read)."""
        self._ahead: dict[tuple[str, int], _Ahead] = {}
        """Ranges resumed before their turn, with the records fetched so far."""
        self._consumer = clients.consumer(
            {"group.id": group, **RANGE_CONSUMER},
            defaults=fetch_defaults(clients.conf),
        )
        self._consume = choose_consume(self._consumer)
        """``consume(max_messages, timeout_s)`` on the consumer: the native one, or confluent-kafka's."""

    @contextmanager
    def assigned(self, ranges: Sequence[tuple[str, int, int, int]]) -> Iterator[None]:
        """Assign every ``(topic, partition, start, end)`` (a partition group's) at once, paused, the
        ranges in the order they will be read; inside, a :meth:`read_chunks` of one of them resumes that
        partition for its range, and the small ranges after it (:data:`AHEAD_RECORDS`,
        :data:`AHEAD_PARTITIONS`) to fetch them ahead. One assignment for all of them: the consumer
        learns all its topics' leaders together, instead of each range's first fetch waiting about a
        second for a topic newly assigned alone. Partitions not being read or fetched ahead stay paused
        and fetch nothing."""
        with self._lock:
            if self._assignment:
                raise RuntimeError("a RangeReader holds one assignment of ranges at a time")
            self._assignment = [
                TopicPartition(topic, partition, start) for topic, partition, start, _ in ranges
            ]
            self._plan = [((topic, partition), start, end) for topic, partition, start, end in ranges]
            for key, _start, end in self._plan:
                self._planned_end[key] = max(end, self._planned_end.get(key, end))
            try:
                self._assign_all()
                yield
            finally:
                # librdkafka keeps a partition's pause across assignments: a later range of it,
                # assigned alone, would never fetch.
                self._consumer.resume(self._assignment)
                self._assignment, self._paused, self._failed = [], None, False
                self._plan, self._planned, self._ahead, self._planned_end = [], 0, {}, {}
                self._consumer.unassign()

    def _assign_all(self) -> None:
        """The ranges' partitions assigned at their starts, all paused; nothing fetched ahead."""
        self._consumer.assign(self._assignment)
        self._consumer.pause(self._assignment)
        self._paused = {(p.topic, p.partition): p.offset for p in self._assignment}
        self._ahead = {}

    def _fetch_ahead(self, current: tuple[str, int]) -> None:
        """Resume the next planned ranges (not ``current``'s) within the budget, at their starts, once
        those fetched ahead are down to :data:`REFILL_SHARE` of it."""
        paused = self._paused
        assert paused is not None
        if len(self._ahead) > AHEAD_PARTITIONS * REFILL_SHARE:
            return
        held = sum(a.end - a.start for a in self._ahead.values())
        if held > AHEAD_RECORDS * REFILL_SHARE:
            return
        resumed = []
        while self._planned < len(self._plan) and len(self._ahead) < AHEAD_PARTITIONS:
            key, start, end = self._plan[self._planned]
            if key == current or key in self._ahead or paused.get(key) != start or end <= start:
                # Being read, not where a resume starts it, or empty (nothing would pause it): its turn.
                self._planned += 1
                continue
            if held + end - start > AHEAD_RECORDS:
                break
            self._planned += 1
            held += end - start
            self._ahead[key] = _Ahead(start, end)
            paused[key] = None
            resumed.append(TopicPartition(*key))
        if resumed:
            self._consumer.resume(resumed)

    def _keep_ahead(self, consumed: Consumed) -> None:
        """Records (and EOFs) of ranges fetched ahead, kept up to each range's end; a range complete
        or failed is paused (a failed one is read, and fails, in its turn). Kept as copies: a slice
        would hold its whole consume batch's buffers until its turn."""
        done = []
        for key, batch in consumed.runs:  # before the events: a partition's EOF comes after its records
            ahead = self._ahead.get(key)
            if ahead is None or ahead.complete:
                continue  # whole: the rest is past its end
            kept = within(batch, ahead.start, ahead.end)
            if kept.num_rows:
                ahead.batches.append(kept.take(pa.array(range(kept.num_rows))))  # a copy
                ahead.position = max(ahead.position, last_offset(kept) + 1)
            if last_offset(batch) >= ahead.end:
                ahead.position = ahead.end
            if ahead.complete:
                done.append(TopicPartition(*key))
        for event_key, offset, error in consumed.events:
            ahead = self._ahead.get(event_key) if event_key is not None else None
            if event_key is None or ahead is None or ahead.complete:
                continue  # failed earlier in this batch, or whole
            if error.code() != KafkaError._PARTITION_EOF:
                del self._ahead[event_key]  # its turn seeks to its start and meets the error itself
                done.append(TopicPartition(*event_key))
                continue
            ahead.position = max(ahead.position, offset)
            if ahead.complete:
                done.append(TopicPartition(*event_key))
        if done:
            self._consumer.pause(done)

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        """The visible (committed, not aborted) records of ``[start, end)``, offsets ascending."""
        chunks = list(self.read_chunks(topic, partition, start, end))
        return pa.concat_tables(chunks) if chunks else RAW_RECORD_SCHEMA.empty_table()

    def read_chunks(
        self, topic: str, partition: int, start: int, end: int, max_records: int | None = None
    ) -> Iterator[pa.Table]:
        """The visible records of ``[start, end)`` in tables of at most ``max_records`` (all at once
        when ``None``), offsets ascending; nothing for an empty range. The reader's lock and
        assignment are held until the generator is exhausted or closed."""
        if start >= end:
            return
        limit = max_records if max_records is not None else end - start
        with self._lock, self._range_assigned(topic, partition, start, end) as kept:
            pending: list[pa.RecordBatch] = []
            count = 0
            for batch in self._read_assigned(topic, partition, start, end, kept):
                pending.append(batch)
                count += batch.num_rows
                while count >= limit:
                    table = pa.Table.from_batches(pending, RAW_RECORD_SCHEMA)
                    yield table.slice(0, limit)
                    rest = table.slice(limit)
                    pending, count = rest.to_batches(), rest.num_rows
            if pending:
                yield pa.Table.from_batches(pending, RAW_RECORD_SCHEMA)

    @contextmanager
    def _range_assigned(self, topic: str, partition: int, start: int, end: int) -> Iterator[_Ahead | None]:
        """The partition fetching from ``start`` while the range is read: assigned alone, or, inside
        :meth:`assigned`, resumed (after a seek unless it is paused right there) and paused again
        (or left fetching for the next step, :meth:`_goes_on_at`); the range's records fetched
        ahead, if it was, are yielded and it fetches on from there."""
        paused = self._paused
        if paused is None:
            self._consumer.assign([TopicPartition(topic, partition, start)])
            try:
                yield None
            finally:
                self._consumer.unassign()
            return
        key = (topic, partition)
        if key not in paused:
            raise ValueError(f"{topic}[{partition}] is not one of the assigned partition group's partitions")
        if self._failed:
            # A failed fetch can leave the partition in a state no seek leaves (an offset out of
            # range), and a seek right after a new assignment fails with ERR__STATE until librdkafka
            # has started the partition: all are assigned afresh, this one at this range's start.
            self._assignment = [
                TopicPartition(p.topic, p.partition, start if (p.topic, p.partition) == key else p.offset)
                for p in self._assignment
            ]
            self._assign_all()
            self._failed = False
            paused = self._paused
            assert paused is not None
        kept = self._ahead.pop(key, None)
        if kept is not None and not kept.start <= start <= kept.position:
            # Its fetch ahead began past this read's start, or has not reached it yet (a partly
            # delivered slice): paused[key] is None, so the partition seeks to the start, paused
            # first so that librdkafka drops what it fetched for it.
            self._consumer.pause([TopicPartition(topic, partition)])
            kept = None
        if kept is None:
            if paused[key] != start:
                # A seek restarts the partition's fetching (~0.1 s): only for a range that does not
                # start where its partition was assigned (a partly delivered slice) or a range read again.
                self._consumer.seek(TopicPartition(topic, partition, start))
            # Where it stops is not tracked (the read drops what comes past the end): seek next time.
            paused[key] = None
            self._consumer.resume([TopicPartition(topic, partition)])
        # else: fetched ahead, it is still resumed and fetching on, or paused at its range's end.
        stays_paused = kept is not None and kept.complete  # paused there by _keep_ahead
        self._fetch_ahead(key)
        try:
            yield kept
        except Exception:
            self._failed = True  # the next read starts from a fresh assignment
            self._consumer.pause([TopicPartition(topic, partition)])
            raise
        except BaseException:  # the read closed before its end
            self._consumer.pause([TopicPartition(topic, partition)])
            raise
        if self._goes_on_at(key, end):
            paused[key] = end  # not paused: its queue holds the next step's first records
        elif not stays_paused:  # a pause waits for the partition's broker thread: only if it fetches
            self._consumer.pause([TopicPartition(topic, partition)])

    def _goes_on_at(self, key: tuple[str, int], end: int) -> bool:
        """Whether a read that ended at ``end`` leaves its partition fetching for the next one: a
        step of a paced task (``protocol/pacing.py``) ended inside the partition's planned range, so
        the next step reads on from ``end``, and the consumer handed out exactly the records before
        it. Paused, the next step's read sought and waited for a fresh fetch (0.1-0.6 s a step
        under load, measured); left fetching, the records are already queued. A read of another
        partition in between drops them and the next read seeks (:meth:`_own`)."""
        if end >= self._planned_end.get(key, end):
            return False
        (position,) = self._consumer.position([TopicPartition(*key)])
        return position.offset == end

    def _read_assigned(
        self, topic: str, partition: int, start: int, end: int, kept: _Ahead | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The records ``kept`` from a fetch ahead, then the record batches of each ``consume`` call,
        up to the range's end."""
        position = start
        if kept is not None:
            position = max(start, min(kept.position, end))
            for batch in kept.batches:
                if (records := within(batch, start, end)).num_rows:
                    yield records
        deadline = time.monotonic() + self.stall_timeout_s
        while position < end:
            # consume() returns when it has the count or the timeout passed, not at partition EOF: a
            # count above what is left made every range's tail wait the whole timeout (1 s per slice).
            # Markers and aborted records make what is left smaller than end - position; then the short
            # timeout bounds the wait, and EOF at or past the end finishes the range.
            asked = min(CONSUME_BATCH, end - position)
            consumed = self._own(self._consume(asked, CONSUME_WAIT_S), topic, partition)
            for _key, offset, error in consumed.events:
                if error.code() == KafkaError._PARTITION_EOF:
                    position = max(position, offset)
                else:
                    self._fail(topic, partition, start, end, error)
            progressed = False
            for _key, batch in consumed.runs:
                records = batch
                if last_offset(batch) >= end:
                    records = within(batch, 0, end)
                    position = end
                if records.num_rows:
                    position = max(position, last_offset(records) + 1)
                    progressed = True
                    yield records
            if progressed or position >= end:
                deadline = time.monotonic() + self.stall_timeout_s
            elif time.monotonic() > deadline:
                raise SourceReadError(
                    f"reading source {topic}[{partition}] [{start}, {end}) made no progress for "
                    f"{self.stall_timeout_s:.0f}s at offset {position}: the broker did not return the "
                    "planned offsets (unreachable, or the topic was recreated with fewer records).\n"
                    "  fix: check the broker and the topic; if it was recreated, move the Spark checkpoint "
                    "aside and reset the sink group's offset for the partition"
                )

    def _own(self, consumed: Consumed, topic: str, partition: int) -> Consumed:
        """The records and events of the partition being read (and errors of none); inside
        :meth:`assigned`, those of ranges fetched ahead are kept for their turn.

        Pausing a partition makes librdkafka drop what it had queued for it, so a stale message of a
        partition read before is rare. One of a partition neither read nor fetched ahead moved its
        position: it is dropped (its EOF must never end this range) and, inside :meth:`assigned`, the
        partition seeks before its next read."""
        own: PartitionKey = (topic, partition)
        runs = [(key, batch) for key, batch in consumed.runs if key == own]
        events = [event for event in consumed.events if event[0] in (own, None)]
        if len(runs) == len(consumed.runs) and len(events) == len(consumed.events):
            return consumed
        paused = self._paused
        if paused is not None:
            others = Consumed(
                [run for run in consumed.runs if run[0] != own],
                [event for event in consumed.events if event[0] not in (own, None)],
            )
            self._keep_ahead(others)
            for key in {run[0] for run in others.runs} | {event[0] for event in others.events if event[0]}:
                if key not in self._ahead:
                    paused[key] = None
        return Consumed(runs, events)

    def _fail(self, topic: str, partition: int, start: int, end: int, error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            low, _high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.stall_timeout_s, cached=False
            )
            raise SourceDataLossError(topic, partition, start, end, int(low), self.group)
        raise SourceReadError(
            f"reading source {topic}[{partition}] [{start}, {end}) failed: {error.str()}.\n"
            "  fix: check the broker, the topic and the kafka: section's credentials and ACLs (the "
            "sink needs READ on the source topics)"
        ) from KafkaException(error)

    def close(self) -> None:
        self._consumer.close()
