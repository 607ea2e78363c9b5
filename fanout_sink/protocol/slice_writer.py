"""What a partition group's slices write: their records routed into data files and key files, and
the ``DataWritten`` events that will announce them.

The worker (:mod:`.worker`) fences, reads the delivered offsets and owns the transaction; it hands
this module the records left to deliver of each slice of a partition group, and commits what comes
back. The partition group's slices share their open files: an append table gets one file per task
(rolled at its target size), not one per partition. Here each slice streams through routing and
conversion (the ``SliceProcessor``) in chunks of at most ``chunk_records`` records, so
a worker holds one chunk's working set whatever the slice's size: append tables' rows wait for
their target file size across chunks (:mod:`.rolling_files`), a change table's chunks are written
with their key files and announced one by one, in order. Files are invisible until a round appends
them; a crash before the transaction leaves only orphan files.

A partition group is written again, from a new read of its records, when its files come out too
old to commit (a stall past half of orphan cleanup's safety age) or when one of its tables was
dropped and recreated meanwhile. The events are packed to fit the control topic's messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from fanout_sink.errors import FanoutSinkError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.topics import max_message_bytes
from fanout_sink.protocol import datafiles
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import SinkChannel, event_budget
from fanout_sink.protocol.rolling_files import RollingFiles
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.pyiceberg_internals.sql_catalog import current_table_uuids
from fanout_sink.retries import Retry, Tries
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

DECODED_TOGETHER = 5_000
"""Records of small chunks shown to the processor together, at most (``prepare``: one JSON parse for
them; a parse per ~30-record slice was a fifth of a worker's CPU at 5,000 tables, issue 50)."""

STALL_RETRY = Retry(attempts=4)
"""A slice whose files stalled past half the orphan age is written again at once, 3 times at most
in a row, before the worker gives up."""

TABLE_CHECK_RETRY = Retry(attempts=3)
"""Writes of one slice at most when its tables keep being recreated; the last one goes out unchecked
(the coordinator rewrites files found for an old table uuid into the new table)."""


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


def table_ref(table: Table) -> ev.TableRef:
    """The reference a ``DataWritten`` carries: identifier plus the uuid the files were written for."""
    *namespace, name = table.name()
    return ev.TableRef(namespace=tuple(namespace), name=name, uuid=str(table.metadata.table_uuid))


@dataclass(frozen=True)
class SliceInput:
    """One slice of a partition group as the writer takes it: where its records come from, the delivered
    offset the worker read (``None``: never delivered), and the result its counts go to."""

    planned: Slice
    source: pa.Table | SliceSource
    committed: int | None
    result: SliceResult


@dataclass
class SliceWrite:
    """What one write of a partition group made, gathered over its slices and chunks."""

    events: list[ev.DataWritten] = field(default_factory=list)
    tables: dict[str, Table] = field(default_factory=dict)
    """Per identifier, the table as the processor last handed it out (checked before the transaction)."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    table_changed: Callable[[str, Table | None], None] | None = None
    times: dict[Slice, tuple[int, int]] = field(default_factory=dict)
    """Per slice, its oldest and newest record timestamp in ms (the coordinator derives VTTS from both)."""
    last_slice: dict[str, Slice] = field(default_factory=dict)
    """Per append table, the slice its rolled files' last rows came from (named by their events)."""

    def take_timestamps(self, planned: Slice, chunk: pa.Table) -> None:
        bounds = pc.min_max(chunk["timestamp"].cast(pa.int64())).as_py()
        low, high = bounds["min"], bounds["max"]
        if low is None or high is None:
            return
        low_ms, high_ms = int(low) // 1000, int(high) // 1000
        seen = self.times.get(planned)
        if seen is not None:
            low_ms, high_ms = min(seen[0], low_ms), max(seen[1], high_ms)
        self.times[planned] = (low_ms, high_ms)

    def timestamps(self, planned: Slice) -> tuple[int | None, int | None]:
        """The slice's oldest and newest record timestamp, ``(None, None)`` without records."""
        return self.times.get(planned, (None, None))


class SliceWriter:
    """Writes partition groups' slices of one sink; holds none between calls (one per worker, shared by its
    threads)."""

    def __init__(
        self,
        channel: SinkChannel,
        max_files_per_event: int = 100,
        file_age_limit_s: float | None = None,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
    ) -> None:
        """``file_age_limit_s``: orphan cleanup's safety age (``maintenance.orphan-older-than``, the
        smallest configured): files written more than half of it before their transaction are
        written again, since cleanup may delete them before the transaction names them.
        ``chunk_records``: records processed at once (a source's chunks are taken as they come; a
        table handed in is cut to this size)."""
        self.channel = channel
        self.sink = channel.sink
        self.control_topic = channel.control_topic
        self.max_files_per_event = max(1, max_files_per_event)
        self.file_age_limit_s = file_age_limit_s
        self.chunk_records = max(1, chunk_records)
        self._control_max_bytes: int | None = None

    def control_limit(self) -> int:
        """The control topic's message size limit, asked once per process."""
        if self._control_max_bytes is None:
            self._control_max_bytes = max_message_bytes(self.channel.clients, self.control_topic)
        return self._control_max_bytes

    def write(self, parts: Sequence[SliceInput], process: SliceProcessor) -> SliceWrite:
        """Each slice's records from its delivered offset on, written; what announces them.

        Each slice's ``result`` gets the counts of the last write (a write again starts them over)."""
        planned = parts[0].planned  # names the partition group in messages and fault points
        writes = TABLE_CHECK_RETRY.start()  # every write counts, a stalled one's too
        stalls = STALL_RETRY.start()
        while True:
            written_at = time.time()  # wall time, as cleanup compares file times: a paused VM counts
            written = self._write(parts, process)
            fault_point("worker.after-write-files", topic=planned.topic, partition=planned.partition)
            # Are the tables still the ones the files were written for? A processor's cached table
            # outlives a drop and recreate, and files for the old uuid would never be the new table's.
            changed = {} if writes.last else self._changed_tables(written.tables)
            for identifier, current in changed.items():
                log.warning(
                    "%s: table %s was %s since it was loaded; writing the slice again",
                    planned,
                    identifier,
                    "dropped" if current is None else f"recreated (uuid {current.metadata.table_uuid})",
                    extra={
                        "topic": planned.topic,
                        "partition": planned.partition,
                        "offset": planned.start,
                        "table": identifier,
                    },
                )
                if written.table_changed is not None:
                    written.table_changed(identifier, current)
            # The age last, after the catalog calls above: a catalog load that hangs past the orphan
            # age must not let the transaction name files cleanup may have deleted (issue 33 item 3).
            if not changed and not self._stalled(written_at, planned, stalls):
                return written
            writes.again()  # past the last check, writes go on unchecked: the count stays there

    def _chunks(self, part: SliceInput) -> Iterator[pa.Table]:
        """The slice's records left to deliver, chunk by chunk; read anew for every write."""
        planned, source, committed, result = part.planned, part.source, part.committed, part.result
        first = max(planned.start, committed or planned.start)
        read = source(first, planned.end) if callable(source) else source
        got: Iterable[pa.Table] = read
        if isinstance(read, pa.Table):
            size = self.chunk_records
            got = (read.slice(i, size) for i in range(0, read.num_rows, size))
        try:
            for chunk in got:
                result.records_in += chunk.num_rows
                if committed is None or committed <= planned.start:
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

    def _read_ahead(
        self, parts: Sequence[SliceInput], process: SliceProcessor
    ) -> Iterator[tuple[SliceInput, pa.Table]]:
        """Every slice's non-empty chunks in order; consecutive small ones (each a slice's last: smaller
        than a chunk) are read ahead together, up to :data:`DECODED_TOGETHER` records, and shown to the
        processor before it gets the first of them."""
        prepare = getattr(process, "prepare", None)
        held: list[tuple[SliceInput, pa.Table]] = []

        def shown() -> list[tuple[SliceInput, pa.Table]]:
            if len(held) > 1 and prepare is not None:
                prepare([chunk for _, chunk in held])
            return held

        for part in parts:
            for chunk in self._chunks(part):
                if not chunk.num_rows:
                    continue
                # Large, or more of its slice may follow: processed as it comes, after those held.
                alone = prepare is None or chunk.num_rows >= min(self.chunk_records, DECODED_TOGETHER)
                if alone or sum(c.num_rows for _, c in held) + chunk.num_rows > DECODED_TOGETHER:
                    yield from shown()
                    held = []
                if alone:
                    yield part, chunk
                else:
                    held.append((part, chunk))
        yield from shown()

    def _stalled(self, written_at: float, planned: Slice, stalls: Tries) -> bool:
        """Whether the slice's files are too old to commit: an unannounced file older than orphan
        cleanup's safety age may be gone already, and a table whose snapshot names a missing file
        fails every scan. Half the age leaves the transaction itself ample time."""
        limit = self.file_age_limit_s
        age = time.time() - written_at
        if limit is None or age <= limit / 2:
            return False
        if not stalls.again():
            raise FanoutSinkError(
                f"{planned}: the slice's files were {age:.0f} s old before their transaction "
                f"{stalls.number} times in a row, more than half of orphan cleanup's safety age "
                f"({limit:.0f} s).\n  fix: raise maintenance.orphan-older-than well above the time a "
                "slice takes (hours or days outside tests)"
            )
        log.warning(
            "%s: files written %.0f s ago, more than half of maintenance.orphan-older-than (%.0f s): "
            "orphan cleanup may delete them before the transaction names them; writing them again",
            planned,
            age,
            limit,
            extra={"topic": planned.topic, "partition": planned.partition, "offset": planned.start},
        )
        return True

    def _write(self, parts: Sequence[SliceInput], process: SliceProcessor) -> SliceWrite:
        """Route the partition group's slices one after another, chunk by chunk, and write their data files;
        the events that will announce them.

        An append table's rows roll into files of its target size across chunks and slices. A change
        table's chunk is written and announced at once: its events follow the earlier chunks' in the
        transaction, and the coordinator lets a key's last change set win, so a key changed in two
        chunks ends in the later change."""
        out = SliceWrite()
        for part in parts:
            result = part.result
            result.records_in = result.skipped_delivered = result.filtered = result.dead_lettered = 0
            result.rows, result.files, result.deleted_keys = {}, {}, {}
        rolling = RollingFiles()
        try:
            for part, chunk in self._read_ahead(parts, process):
                self._write_chunk(part.planned, chunk, process, part.result, out, rolling)
            written = rolling.finish()
        except BaseException:
            rolling.discard()
            raise
        results = {part.planned: part.result for part in parts}
        for identifier, incarnations in written.items():
            last = out.last_slice[identifier]
            results[last].files[identifier] = sum(len(files.records) for files in incarnations)
            for files in incarnations:  # each file under the uuid it was written for
                out.events += self._announce(self._data_written(files.table, last), files.records)
        return out

    def _write_chunk(
        self,
        planned: Slice,
        chunk: pa.Table,
        process: SliceProcessor,
        result: SliceResult,
        out: SliceWrite,
        rolling: RollingFiles,
    ) -> None:
        """One chunk of a slice routed: append tables' rows into their open files, a change table's
        rows written and announced now."""
        out.take_timestamps(planned, chunk)
        routed = process(chunk)
        out.table_changed = routed.table_changed
        out.dead_letters += routed.dead_letters
        result.dead_lettered += len(routed.dead_letters)
        result.filtered += routed.filtered
        for identifier, table_rows in routed.tables.items():
            table = table_rows.table
            out.tables[identifier] = table
            result.rows[identifier] = result.rows.get(identifier, 0) + table_rows.rows.num_rows
            if not table_rows.key:
                rolling.add(identifier, table, table_rows.rows)
                out.last_slice[identifier] = planned
                continue
            data_files = datafiles.write_data_files(table, table_rows.rows)
            result.files[identifier] = result.files.get(identifier, 0) + len(data_files)
            deleted = table_rows.deleted_keys
            key_files: tuple[ev.KeyFile, ...] = ()
            if deleted is not None and deleted.num_rows:
                key_files = (datafiles.write_key_file(table, deleted),)
                result.deleted_keys[identifier] = result.deleted_keys.get(identifier, 0) + deleted.num_rows
            records = [datafiles.to_record(f, table) for f in data_files]
            first = self._data_written(table, planned, table_rows.key, key_files)
            out.events += self._announce(first, records)

    @staticmethod
    def _data_written(
        table: Table, planned: Slice, key: tuple[str, ...] = (), key_files: tuple[ev.KeyFile, ...] = ()
    ) -> ev.DataWritten:
        """The first event announcing a table's files (a change table's: of one chunk, with its key)."""
        return ev.DataWritten(
            table=table_ref(table),
            files=(),
            topic=planned.topic,
            partition=planned.partition,
            next_offset=planned.end,
            key=key,
            deleted_keys=key_files,
        )

    def _announce(self, first: ev.DataWritten, records: list[ev.DataFileRecord]) -> list[ev.DataWritten]:
        """``records`` in as few ``DataWritten`` events as fit the control topic (``first`` carries
        the slice's deleted keys, the others none): a message over the topic's ``max.message.bytes``
        would fail the transaction on every retry and stall the partition for good. A file whose
        record alone does not fit travels without its column bounds, then without any column metrics
        (both optional in Iceberg: readers only prune less)."""
        budget = event_budget(self.sink, self.control_limit())
        base = self._event_bytes(first)
        if base > budget:
            raise FanoutSinkError(
                f"the control event for {first.table.identifier} from {first.topic}[{first.partition}] needs "
                f"{base} bytes before any file, more than the control topic {self.control_topic} accepts "
                f"({self.control_limit()}).\n  fix: raise the topic's max.message.bytes"
            )
        per_event: list[list[ev.DataFileRecord]] = [[]]
        size = base
        for original in records:
            record, own = self._fitting(first, base, original, budget - base)
            if per_event[-1] and (size + own > budget or len(per_event[-1]) >= self.max_files_per_event):
                per_event.append([])
                size = base
            per_event[-1].append(record)
            size += own
        events = [
            first.model_copy(
                update={"files": tuple(files)} if i == 0 else {"files": tuple(files), "deleted_keys": ()}
            )
            for i, files in enumerate(per_event)
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
            f"control topic {self.control_topic} even without column metrics ({self.control_limit()} "
            "bytes allowed).\n  fix: raise the control topic's max.message.bytes"
        )

    @staticmethod
    def _changed_tables(tables: dict[str, Table]) -> dict[str, Table | None]:
        """Tables of the slice that the catalog now holds under another uuid (or not at all).

        The price of never writing rows for a table that was dropped and recreated meanwhile (files
        the coordinator would have to rewrite or refuse): a SQL catalog's tables are checked by their
        pointers, a query per 500 tables (:func:`current_table_uuids`), others by one load each.
        """
        for identifier in tables:
            fault_point("worker.table-check", table=identifier)  # the chaos runner's catalog stall
        try:
            uuids = current_table_uuids(tables)
        except Exception:
            # The check only narrows a window; a catalog that cannot answer now leaves it to the
            # coordinator (it re-checks the uuid and rewrites or names stale files).
            log.warning("could not re-check %d table(s) before the transaction", len(tables), exc_info=True)
            return {}
        changed: dict[str, Table | None] = {}
        for identifier, table in tables.items():
            if identifier in uuids:
                if uuids[identifier] == str(table.metadata.table_uuid):
                    continue
                if uuids[identifier] is None:
                    changed[identifier] = None
                    continue
            try:  # the recreated table's metadata, or a table whose catalog has no batched check
                current = table.catalog.load_table(table.name())
            except NoSuchTableError:
                changed[identifier] = None
                continue
            except Exception:
                log.warning("could not re-check table %s before the transaction", identifier, exc_info=True)
                continue
            if current.metadata.table_uuid != table.metadata.table_uuid:
                changed[identifier] = current
        return changed
