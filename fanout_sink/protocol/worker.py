"""The worker commit unit: one source topic-partition slice -> data files + one Kafka transaction.

This is where invariants I1 (no gap, no overlap), I2 (events and offsets are atomic) and the
worker half of I3 (fencing) are kept. The order of steps is the protocol:

1. Get the producer of the transactional id ``fanout-sink:<sink>:<topic>:<partition>``. Creating it
   runs ``init_transactions``, which fences every older attempt holding that id, so no attempt
   started before can commit after this point.
2. Only then read the sink-managed group's committed offset (``require_stable``: pending
   transactional commits are waited for). It is the truth about what was delivered:
   at or past the slice's end, nothing is left to do (nothing is read); inside the slice, only
   ``[committed, end)`` is read (or, for records handed in already read, the delivered head is
   dropped); before the slice's start, records in between were lost upstream: stop (a gap).
3. Read the source records that are left (a :data:`SliceSource`), route and convert them (the
   ``SliceProcessor``), write data files (invisible until appended). A slice streams through these
   steps in chunks of at most ``chunk_records`` records, so a worker holds one chunk's working set
   whatever the slice's size; append tables' rows wait for their target file size across chunks
   (:mod:`.rolling_files`), a change table's chunks are announced one by one, in order.
4. One transaction: ``DataWritten`` per table, ``DataComplete``, dead letters, and the source offset
   (the planned end offset, never last record + 1: offsets have holes) sent to the sink group with
   generation -1 metadata (``recovery.send_delivered``, the one writer of the sink group). Commit. A
   crash before the commit leaves only orphan files.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from fanout_sink.errors import FanoutSinkError, OffsetGapError, ProducerFencedError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.kafka.topics import max_message_bytes, topic_ids
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, datafiles, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.rolling_files import RollingFiles
from fanout_sink.transform import deadletter
from fanout_sink.transform.records import DeadLetter, SliceProcessor

log = logging.getLogger(__name__)

SliceSource = Callable[[int, int], pa.Table | Iterable[pa.Table]]
"""``read(from, until)``: the visible records of ``[from, until)`` of the slice's partition, in
``RAW_RECORD_SCHEMA``, offsets ascending: one table, or chunks of it (``RangeReader.read_chunks``
in a task, so the slice is never whole in memory). The worker calls it after fencing and reading
the delivered offset, so a replayed slice reads only what is left; again only when it writes the
slice again (files too old to commit, a table recreated meanwhile): it keeps no records in between."""

DEFAULT_CHUNK_RECORDS = 50_000
"""Records per chunk unless configured (``spark.max-records-per-batch``)."""


def _without_bounds(record: ev.DataFileRecord) -> ev.DataFileRecord:
    return record.model_copy(update={"lower_bounds": {}, "upper_bounds": {}})


def _without_metrics(record: ev.DataFileRecord) -> ev.DataFileRecord:
    return record.model_copy(
        update={
            "lower_bounds": {},
            "upper_bounds": {},
            "column_sizes": {},
            "value_counts": {},
            "null_value_counts": {},
            "nan_value_counts": {},
        }
    )


STALL_REWRITES = 3
"""Writes of one slice at most after stalls past half the orphan age, before the worker gives up."""

TABLE_CHECKS = 3
"""Writes of one slice at most when its tables keep being recreated; the last one goes out unchecked
(the coordinator rewrites files found for an old table uuid into the new table)."""


@dataclass
class SliceResult:
    """What one ``commit_slice`` did; the counts reconcile (invariant I5) per slice:
    ``records_in - skipped_delivered = sum(rows, counted per route) + dead_lettered + filtered``
    when every record goes to exactly one table. ``records_in`` counts the records read: a source
    reads from the delivered offset on, so delivered records are neither read nor counted; records
    handed in already read (a table) are all counted, the delivered ones in ``skipped_delivered``."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    committed_before: int | None
    records_in: int = 0
    skipped_delivered: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    deleted_keys: dict[str, int] = field(default_factory=dict)
    """Per change table, the keys the slice deletes (resolved against the table at commit)."""
    dead_lettered: int = 0
    filtered: int = 0
    transaction_committed: bool = False


def table_ref(table: Table) -> ev.TableRef:
    """The reference a ``DataWritten`` carries: identifier plus the uuid the files were written for."""
    *namespace, name = table.name()
    return ev.TableRef(namespace=tuple(namespace), name=name, uuid=str(table.metadata.table_uuid))


@dataclass
class _SliceWrite:
    """What one write of a slice made, gathered over its chunks."""

    events: list[ev.DataWritten] = field(default_factory=list)
    tables: dict[str, Table] = field(default_factory=dict)
    """Per identifier, the table as the processor last handed it out (checked before the transaction)."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    table_changed: Callable[[str, Table | None], None] | None = None
    oldest_ms: int | None = None
    newest_ms: int | None = None
    """Oldest and newest record timestamp of the slice (the coordinator derives VTTS from both)."""

    def take_timestamps(self, chunk: pa.Table) -> None:
        bounds = pc.min_max(chunk["timestamp"].cast(pa.int64())).as_py()
        low, high = bounds["min"], bounds["max"]
        if low is not None:
            low_ms = int(low) // 1000
            self.oldest_ms = low_ms if self.oldest_ms is None else min(self.oldest_ms, low_ms)
        if high is not None:
            high_ms = int(high) // 1000
            self.newest_ms = high_ms if self.newest_ms is None else max(self.newest_ms, high_ms)


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
        sink: SinkChannel,
        dead_letter_topic: str | None = None,
        max_files_per_event: int = 100,
        file_age_limit_s: float | None = None,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
    ) -> None:
        """``file_age_limit_s``: orphan cleanup's safety age (``maintenance.orphan-older-than``, the
        smallest configured): files written more than half of it before their transaction are
        written again, since cleanup may delete them before the transaction names them.
        ``chunk_records``: records processed at once (a source's chunks are taken as they come; a
        table handed in is cut to this size)."""
        self.channel = sink
        self.chunk_records = max(1, chunk_records)
        self.file_age_limit_s = file_age_limit_s
        self.sink = sink.sink
        self.max_files_per_event = max(1, max_files_per_event)
        self.control_topic = sink.control_topic
        self.dead_letter_topic = dead_letter_topic
        self.group = sink.sink_group
        self.timeout_s = sink.timeout_s
        self._group_metadata: bytes | None = None
        self._producers: dict[str, TransactionalProducer] = {}
        self._committed_to: dict[str, int] = {}
        """Per transactional id, the end offset of the last slice its cached producer committed."""
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._offsets: GroupOffsets | None = None
        self._control_checked = False
        self._dead_letter_max_bytes: int | None = None
        self._control_max_bytes: int | None = None

    def committed_offset(self, topic: str, partition: int) -> int | None:
        """The sink-managed group's stable committed offset for one source partition."""
        with self._guard:
            if self._offsets is None:
                self._offsets = GroupOffsets(self.channel.clients, self.group, stable=True)
            return self._offsets.committed([(topic, partition)])[(topic, partition)]

    def _metadata(self) -> bytes:
        if self._group_metadata is None:
            self._group_metadata = recovery.sink_group_metadata(self.channel)
        return self._group_metadata

    def _dead_letter_limit(self, topic: str) -> int:
        """The dead-letter topic's message size limit, asked once per process."""
        if self._dead_letter_max_bytes is None:
            self._dead_letter_max_bytes = max_message_bytes(self.channel.clients, topic)
        return self._dead_letter_max_bytes

    def _control_limit(self) -> int:
        """The control topic's message size limit, asked once per process."""
        if self._control_max_bytes is None:
            self._control_max_bytes = max_message_bytes(self.channel.clients, self.control_topic)
        return self._control_max_bytes

    def _lock(self, txn_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(txn_id, threading.Lock())

    def _producer(self, txn_id: str, topic: str, partition: int) -> TransactionalProducer:
        producer = self._producers.get(txn_id)
        if producer is None:
            limits = [self._control_limit()]
            if self.dead_letter_topic is not None:
                limits.append(self._dead_letter_limit(self.dead_letter_topic))
            producer = TransactionalProducer(
                self.channel.clients,
                txn_id,
                batch_bytes=min(limits),
                fenced_message=(
                    f"the transaction for {topic}[{partition}] was fenced: a newer attempt for this "
                    f"partition (transactional id {txn_id!r}) took over. This attempt stops; the "
                    "newer one delivers the records."
                ),
            )
            self._producers[txn_id] = producer
        return producer

    def commit_slice(
        self,
        topic: str,
        partition: int,
        start_offset: int,
        end_offset: int,
        source: pa.Table | SliceSource,
        process: SliceProcessor,
        topic_id: str | None = None,
    ) -> SliceResult:
        """Deliver the planned offset range ``[start_offset, end_offset)`` of one source partition.

        ``source`` reads the records when the worker knows what is left; a table of the range's
        records already read (tests, tools) is taken as it is and its delivered head dropped.
        ``topic_id`` is the topic's id when the batch was planned (the driver asks once per batch);
        without it the worker asks the broker.
        """
        if topic_id is None:
            topic_id = topic_ids(self.channel.clients, [topic]).get(topic)
        txn_id = self.channel.worker_transactional_id(topic, partition)
        if not self._control_checked:
            # Producing to a missing topic only times out; creating or checking it once says why.
            channel.ensure_control_topic(self.channel)
            self._control_checked = True
        with self._lock(txn_id):
            if txn_id in self._producers and self._committed_to.get(txn_id) != start_offset:
                # Another process delivered the range in between (Spark ran the partition's last
                # task in another Python worker): its producer fenced the cached one, which would
                # only find out at the transaction, after the slice's work. Start with a new one.
                self._producers.pop(txn_id)
            cached = txn_id in self._producers
            try:
                result = self._attempt(
                    txn_id, topic, partition, start_offset, end_offset, source, process, topic_id
                )
            except ProducerFencedError:
                if not cached:
                    raise
                # The cached producer was fenced since its last slice: this partition ran in another
                # process meanwhile (Spark moved the task). That is not a zombie situation, so start
                # over once with a new producer, which fences in turn and re-reads the offset.
                log.info("cached producer %s was fenced since its last use; retrying with a new one", txn_id)
                result = self._attempt(
                    txn_id, topic, partition, start_offset, end_offset, source, process, topic_id
                )
            if result.transaction_committed:
                self._committed_to[txn_id] = end_offset
            return result

    def _attempt(
        self,
        txn_id: str,
        topic: str,
        partition: int,
        start: int,
        end: int,
        source: pa.Table | SliceSource,
        process: SliceProcessor,
        topic_id: str | None,
    ) -> SliceResult:
        # A new producer fences older attempts before anything is read.
        producer = self._producer(txn_id, topic, partition)
        committed = self.committed_offset(topic, partition)
        if committed is None:  # expired while the app ran, this partition's first slice, or recreated
            committed = recovery.restore_in_slice(
                self.channel, producer, self._metadata(), topic, partition, topic_id, start
            )
        result = SliceResult(topic, partition, start, end, committed)
        if committed is not None and committed >= end:
            # Nothing is read; records handed in already read were all delivered.
            result.skipped_delivered = result.records_in = 0 if callable(source) else source.num_rows
            return result
        if committed is not None and committed < start:
            raise OffsetGapError(topic, partition, committed, start, end, self.group)
        first = max(start, committed or start)

        def chunks() -> Iterator[pa.Table]:
            """The slice's records left to deliver, chunk by chunk; read anew for every write."""
            read = source(first, end) if callable(source) else source
            got: Iterable[pa.Table] = read
            if isinstance(read, pa.Table):
                size = self.chunk_records
                got = (read.slice(i, size) for i in range(0, read.num_rows, size))
            try:
                for chunk in got:
                    result.records_in += chunk.num_rows
                    if committed is None or committed <= start:
                        yield chunk
                        continue
                    left = pc.greater_equal(chunk["offset"], pa.scalar(committed, pa.int64()))
                    kept = chunk.filter(left)
                    result.skipped_delivered += chunk.num_rows - kept.num_rows
                    yield kept
            finally:
                close = getattr(got, "close", None)
                if close is not None:  # a reader's generator releases its assignment
                    close()

        for attempt in range(1, TABLE_CHECKS + 1):
            written = self._write_in_time(topic, partition, start, end, chunks, process, result)
            # Right before the transaction: are the tables still the ones the files were written
            # for? A processor's cached table outlives a drop and recreate, and files for the old
            # uuid would never be the new table's.
            changed = self._changed_tables(written.tables) if attempt < TABLE_CHECKS else {}
            if not changed:
                break
            for identifier, current in changed.items():
                log.warning(
                    "%s[%d] [%d, %d): table %s was %s since it was loaded; writing the slice again",
                    topic,
                    partition,
                    start,
                    end,
                    identifier,
                    "dropped" if current is None else f"recreated (uuid {current.metadata.table_uuid})",
                    extra={"topic": topic, "partition": partition, "offset": start, "table": identifier},
                )
                if written.table_changed is not None:
                    written.table_changed(identifier, current)
        dead_letter_topic = self.dead_letter_topic
        if written.dead_letters and dead_letter_topic is None:
            bad = written.dead_letters[0]
            raise FanoutSinkError(
                f"{len(written.dead_letters)} record(s) of {topic}[{partition}] in [{start}, {end}) could "
                f"not be delivered and no dead-letter topic is configured (first: headers {bad.headers}).\n"
                "  fix: configure dead-letter.topic, or fix the records / routes."
            )

        try:
            with producer.transaction():
                for event in written.events:
                    channel.produce_event(producer, self.control_topic, self.sink, event)
                complete = ev.DataComplete(
                    topic=topic,
                    partition=partition,
                    next_offset=end,
                    min_timestamp_ms=written.oldest_ms,
                    max_timestamp_ms=written.newest_ms,
                    topic_id=topic_id,
                )
                channel.produce_event(producer, self.control_topic, self.sink, complete)
                if written.dead_letters and dead_letter_topic is not None:
                    # Cut to size: one oversized dead letter would fail this transaction on every retry.
                    limit = self._dead_letter_limit(dead_letter_topic)
                    deadletter.publish(producer, dead_letter_topic, written.dead_letters, limit)
                recovery.send_delivered(producer, self._metadata(), topic, partition, end)
                fault_point("worker.before-commit", topic=topic, partition=partition)
        finally:
            if not producer.usable:  # the next attempt's producer fences this one
                self._producers.pop(txn_id, None)
        fault_point("worker.after-commit", topic=topic, partition=partition)
        result.dead_lettered = len(written.dead_letters)
        result.transaction_committed = True
        return result

    def _write_in_time(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        chunks: Callable[[], Iterator[pa.Table]],
        process: SliceProcessor,
        result: SliceResult,
    ) -> _SliceWrite:
        """:meth:`_write`, again while the files come out too old to commit."""
        stalls = 0
        while True:
            written_at = time.time()  # wall time, as cleanup compares file times: a paused VM counts
            written = self._write(topic, partition, end, chunks(), process, result)
            fault_point("worker.after-write-files", topic=topic, partition=partition)
            if not self._stalled(written_at, topic, partition, start, end, stalls):
                return written
            stalls += 1

    def _stalled(
        self, written_at: float, topic: str, partition: int, start: int, end: int, stalls: int
    ) -> bool:
        """Whether the slice's files are too old to commit: an unannounced file older than orphan
        cleanup's safety age may be gone already, and a table whose snapshot names a missing file
        fails every scan. Half the age leaves the transaction itself ample time."""
        limit = self.file_age_limit_s
        age = time.time() - written_at
        if limit is None or age <= limit / 2:
            return False
        if stalls >= STALL_REWRITES:
            raise FanoutSinkError(
                f"{topic}[{partition}] [{start}, {end}): the slice's files were {age:.0f} s old before "
                f"their transaction {stalls + 1} times in a row, more than half of orphan cleanup's "
                f"safety age ({limit:.0f} s).\n  fix: raise maintenance.orphan-older-than well above "
                "the time a slice takes (hours or days outside tests)"
            )
        log.warning(
            "%s[%d] [%d, %d): files written %.0f s ago, more than half of maintenance.orphan-older-than "
            "(%.0f s): orphan cleanup may delete them before the transaction names them; writing them again",
            topic,
            partition,
            start,
            end,
            age,
            limit,
            extra={"topic": topic, "partition": partition, "offset": start},
        )
        return True

    def _write(
        self,
        topic: str,
        partition: int,
        end: int,
        chunks: Iterator[pa.Table],
        process: SliceProcessor,
        result: SliceResult,
    ) -> _SliceWrite:
        """Route the slice chunk by chunk and write its data files; the events that will announce them.

        An append table's rows roll into files of its target size across chunks. A change table's
        chunk is written and announced at once: its events follow the earlier chunks' in the
        transaction, and the coordinator lets a key's last change set win, so a key changed in two
        chunks ends in the later change."""
        out = _SliceWrite()
        result.records_in = result.skipped_delivered = result.filtered = 0
        result.rows, result.files, result.deleted_keys = {}, {}, {}
        rolling = RollingFiles()
        try:
            for chunk in chunks:
                if chunk.num_rows:
                    self._write_chunk(topic, partition, end, chunk, process, result, out, rolling)
            written = rolling.finish()
        except BaseException:
            rolling.discard()
            raise
        for identifier, files in written.items():
            result.files[identifier] = len(files.records)
            out.events += self._announce(
                self._data_written(files.table, topic, partition, end), files.records
            )
        return out

    def _write_chunk(
        self,
        topic: str,
        partition: int,
        end: int,
        chunk: pa.Table,
        process: SliceProcessor,
        result: SliceResult,
        out: _SliceWrite,
        rolling: RollingFiles,
    ) -> None:
        """One chunk of a slice routed: append tables' rows into their open files, a change table's
        rows written and announced now."""
        out.take_timestamps(chunk)
        routed = process(chunk)
        out.table_changed = routed.table_changed
        out.dead_letters += routed.dead_letters
        result.filtered += routed.filtered
        for identifier, table_rows in routed.tables.items():
            table = table_rows.table
            out.tables[identifier] = table
            result.rows[identifier] = result.rows.get(identifier, 0) + table_rows.rows.num_rows
            if not table_rows.key:
                rolling.add(identifier, table, table_rows.rows)
                continue
            data_files = datafiles.write_data_files(table, table_rows.rows)
            result.files[identifier] = result.files.get(identifier, 0) + len(data_files)
            deleted = table_rows.deleted_keys
            key_files: tuple[ev.KeyFile, ...] = ()
            if deleted is not None and deleted.num_rows:
                key_files = (datafiles.write_key_file(table, deleted),)
                result.deleted_keys[identifier] = result.deleted_keys.get(identifier, 0) + deleted.num_rows
            records = [datafiles.to_record(f, table) for f in data_files]
            first = self._data_written(table, topic, partition, end, table_rows.key, key_files)
            out.events += self._announce(first, records)

    @staticmethod
    def _data_written(
        table: Table,
        topic: str,
        partition: int,
        end: int,
        key: tuple[str, ...] = (),
        key_files: tuple[ev.KeyFile, ...] = (),
    ) -> ev.DataWritten:
        """The first event announcing a table's files (a change table's: of one chunk, with its key)."""
        return ev.DataWritten(
            table=table_ref(table),
            files=(),
            topic=topic,
            partition=partition,
            next_offset=end,
            key=key,
            deleted_keys=key_files,
        )

    def _announce(self, first: ev.DataWritten, records: list[ev.DataFileRecord]) -> list[ev.DataWritten]:
        """``records`` in as few ``DataWritten`` events as fit the control topic (``first`` carries
        the slice's deleted keys, the others none): a message over the topic's ``max.message.bytes``
        would fail the transaction on every retry and stall the partition for good. A file whose
        record alone does not fit travels without its column bounds, then without any column metrics
        (both optional in Iceberg: readers only prune less)."""
        budget = channel.event_budget(self.sink, self._control_limit())
        base = self._event_bytes(first)
        if base > budget:
            raise FanoutSinkError(
                f"the control event for {first.table.identifier} from {first.topic}[{first.partition}] needs "
                f"{base} bytes before any file, more than the control topic {self.control_topic} accepts "
                f"({self._control_limit()}).\n  fix: raise the topic's max.message.bytes"
            )
        groups: list[list[ev.DataFileRecord]] = [[]]
        size = base
        for original in records:
            record, own = self._fitting(first, base, original, budget - base)
            if groups[-1] and (size + own > budget or len(groups[-1]) >= self.max_files_per_event):
                groups.append([])
                size = base
            groups[-1].append(record)
            size += own
        events = [
            first.model_copy(
                update={"files": tuple(files)} if i == 0 else {"files": tuple(files), "deleted_keys": ()}
            )
            for i, files in enumerate(groups)
        ]
        return [e for e in events if e.files or e.deleted_keys]

    def _event_bytes(self, event: ev.DataWritten) -> int:
        return len(ev.encode(ev.Event(sink=self.sink, payload=event)))

    def _fitting(
        self, first: ev.DataWritten, empty: int, record: ev.DataFileRecord, room: int
    ) -> tuple[ev.DataFileRecord, int]:
        """The record (cut down if needed) and the bytes it adds to ``first`` (``empty`` bytes)."""
        for cut in (record, _without_bounds(record), _without_metrics(record)):
            own = self._event_bytes(first.model_copy(update={"files": (cut,)})) - empty
            if own <= room:
                if cut is not record:
                    log.warning(
                        "data file %s of %s: its statistics do not fit one control event (%d bytes "
                        "allowed); sent without %s, so readers prune this file less",
                        record.file_path,
                        first.table.identifier,
                        room,
                        "column bounds" if cut.value_counts else "column metrics",
                    )
                return cut, own
        raise FanoutSinkError(
            f"data file {record.file_path} of {first.table.identifier} does not fit one event of the "
            f"control topic {self.control_topic} even without column metrics ({self._control_limit()} "
            "bytes allowed).\n  fix: raise the control topic's max.message.bytes"
        )

    @staticmethod
    def _changed_tables(tables: dict[str, Table]) -> dict[str, Table | None]:
        """Tables of the slice that the catalog now holds under another uuid (or not at all).

        One catalog load per table and slice: the price of never writing rows for a table that
        was dropped and recreated meanwhile (files the coordinator would have to rewrite or refuse).
        """
        changed: dict[str, Table | None] = {}
        for identifier, table in tables.items():
            try:
                current = table.catalog.load_table(table.name())
            except NoSuchTableError:
                changed[identifier] = None
                continue
            except Exception:
                # The check only narrows a window; a table that cannot be loaded now is the
                # coordinator's to report (it re-checks the uuid and rewrites or names stale files).
                log.warning("could not re-check table %s before the transaction", identifier, exc_info=True)
                continue
            if current.metadata.table_uuid != table.metadata.table_uuid:
                changed[identifier] = current
        return changed

    def close(self) -> None:
        """Flush and drop the cached producers (an open transaction, if any, times out and aborts)."""
        for producer in self._producers.values():
            producer.flush(self.timeout_s)
        self._producers.clear()
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None
