"""The coordinator's memory between rounds: files waiting per table, and what each partition reported.

Kept apart from the coordinator's I/O so that the bookkeeping rules (which events belong to a round,
how far the control topic may be acknowledged, what VTTS is) are plain code over plain data.

Everything here can be rebuilt after a crash by re-reading the control topic from the coordinator
group's low watermark: nothing in it is the source of truth, the tables' summaries and the
sink-managed group are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fanout_sink.kafka.offsets import PartitionPosition
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import ControlEvent


@dataclass(frozen=True)
class PendingFiles:
    """One ``DataWritten`` not yet appended, with the control offset it was read at."""

    offset: int
    event: ev.DataWritten
    written_ms: int | None = None  # when the worker published it (for "pending since" in errors)


@dataclass
class CommitState:
    """Files pending per table identifier, and per source partition the latest reported progress."""

    pending: dict[str, list[PendingFiles]] = field(default_factory=dict)
    # Reports not folded into a round yet, and per (topic, partition) what the folded ones said
    # (their records are committed once the round's tables are): the newest delivered timestamp
    # and the largest step back in time seen between a slice and the slices before it.
    reports: list[tuple[int, ev.DataComplete]] = field(default_factory=list)
    times: dict[tuple[str, int], ev.PartitionTime] = field(default_factory=dict)
    reports_below: int = 0
    """Every report below this control offset is folded into ``times``."""
    delivered: ev.DeliveredPositions = field(default_factory=ev.DeliveredPositions)
    """Per source partition, the largest ``next_offset`` of the reports folded (``reports_below``),
    of the topic id reported last (a recreated topic's positions start over)."""
    committed_through: dict[str, int] = field(default_factory=dict)
    """Per table uuid, the floor its last ``CommitToTable`` announced. A table swapped away (dropped
    or renamed aside) can no longer be asked for its floor, yet a restarted coordinator re-reads its
    events from the low watermark: below this offset they are in the old table already."""
    _restoring: str | None = None
    """The commit id of the round ``_restore`` took last (its later parts belong to it)."""

    def add(self, item: ControlEvent) -> None:
        payload = item.event.payload
        if isinstance(payload, ev.DataWritten):
            self.pending.setdefault(payload.table.identifier, []).append(
                PendingFiles(item.offset, payload, item.event.event_time_ms)
            )
        elif isinstance(payload, ev.DataComplete):
            if item.offset >= self.reports_below:
                self.reports.append((item.offset, payload))
        elif isinstance(payload, ev.CommitComplete):
            self._restore(payload)
        elif isinstance(payload, ev.CommitToTable) and payload.control_offset is not None:
            held = self.committed_through.get(payload.table.uuid, 0)
            self.committed_through[payload.table.uuid] = max(held, payload.control_offset)

    def _restore(self, complete: ev.CommitComplete) -> None:
        """Take over what an earlier round (of this or a previous coordinator process) had folded.

        Keeps VTTS and the carried-forward ``delivered`` positions (which ``recovery`` reads back
        when retention deleted the reports, I1) continuous across coordinator restarts. A restarted
        coordinator re-reads from the low watermark, which never passes the last round's
        ``CommitComplete``, but not the reports below it: without this, partitions that are behind
        would keep VTTS unknown until they report again. Reports at or above ``reports_below`` were
        not in that round and are re-read anyway. A round in parts (``split_round``) is taken part
        by part: the parts after the first continue the round its first part started restoring.
        """
        continued = complete.part > 0 and complete.commit_id == self._restoring
        if complete.reports_below is None or (complete.reports_below <= self.reports_below and not continued):
            return  # an older round, or this process's own round read back
        self._restoring = complete.commit_id
        for time in complete.partition_times:
            self._merge(time)
        self.delivered.take_round(complete)
        self.reports_below = complete.reports_below
        self.reports = [(offset, report) for offset, report in self.reports if offset >= self.reports_below]

    def _merge(self, time: ev.PartitionTime) -> None:
        key = (time.topic, time.partition)
        known = self.times.get(key)
        if known is not None:
            time = time.model_copy(
                update={
                    "max_timestamp_ms": max(known.max_timestamp_ms, time.max_timestamp_ms),
                    "max_disorder_ms": max(known.max_disorder_ms, time.max_disorder_ms),
                }
            )
        self.times[key] = time

    def _fold_reports(self, round_end: int) -> None:
        later = []
        for offset, report in self.reports:
            if offset >= round_end:
                later.append((offset, report))
                continue
            key = (report.topic, report.partition)
            self.delivered.take_report(report)
            if report.max_timestamp_ms is not None:
                known = self.times.get(key)
                disorder = 0
                if known is not None and report.min_timestamp_ms is not None:
                    # Reports of one partition arrive in source-offset order: this slice's oldest
                    # record came after every record the earlier slices delivered.
                    disorder = max(0, known.max_timestamp_ms - report.min_timestamp_ms)
                self._merge(
                    ev.PartitionTime(
                        topic=report.topic,
                        partition=report.partition,
                        max_timestamp_ms=report.max_timestamp_ms,
                        max_disorder_ms=disorder,
                    )
                )
        self.reports = later
        self.reports_below = max(self.reports_below, round_end)

    def checkpoint(self, round_end: int) -> tuple[tuple[ev.PartitionTime, ...], int]:
        """Partition times and the control offset they account for, for the round's
        ``CommitComplete``: a restarted coordinator starts from them (see ``_restore``)."""
        self._fold_reports(round_end)
        return tuple(self.times[key] for key in sorted(self.times)), self.reports_below

    def due(self, round_end: int) -> dict[str, list[PendingFiles]]:
        """Per table, the pending files read below ``round_end`` (later ones wait for the next round)."""
        due = {t: [p for p in items if p.offset < round_end] for t, items in self.pending.items()}
        return {t: items for t, items in sorted(due.items()) if items}

    def cuts_no_transaction(self, round_end: int) -> bool:
        """Whether every file read below ``round_end`` comes from a worker transaction whose reports
        are below it too, so that the round's end is a point of the source stream for every table.

        A transaction's events interleave with others' on the control topic, and the round reads up
        to the last stable offset: a transaction committed while an older one was still open can
        have its first ``DataWritten`` below the end and the rest above it (orders in this round,
        payments of the same slices in the next). Its ``DataComplete`` reports follow all of its
        ``DataWritten``, so a file whose slice has not reported below the end is such a cut.
        """
        self._fold_reports(round_end)
        return all(
            self.delivered.offsets.get((p.event.topic, p.event.partition), -1) >= p.event.next_offset
            for items in self.pending.values()
            for p in items
            if p.offset < round_end
        )

    def settle(self, identifier: str, round_end: int) -> None:
        """Forget a table's files below ``round_end``: appended, already in the table, or refused."""
        left = [p for p in self.pending.get(identifier, []) if p.offset >= round_end]
        if left:
            self.pending[identifier] = left
        else:
            self.pending.pop(identifier, None)

    def low_watermark(self, round_end: int) -> int:
        """The control offset every table has passed: the oldest file still pending, else ``round_end``."""
        oldest = [p.offset for items in self.pending.values() for p in items if p.offset < round_end]
        return min(oldest, default=round_end)

    def vtts(self, positions: list[PartitionPosition], round_end: int) -> int | None:
        """Every record with a timestamp at or below the returned one that was in the source
        partitions when ``positions`` were read is committed (or None: nothing can be said).

        ``positions`` must be read before the round's control end offset is taken, so that whatever
        the sink group had committed then has its events inside the round. A caught-up partition
        (committed = end) does not hold VTTS back. For a partition that is behind, its undelivered
        records are assumed no older than its newest delivered timestamp minus the largest step
        back seen in it so far, and one more millisecond for a tie: with LogAppendTime (or ordered
        producer timestamps) that is exact; with producer-set timestamps it holds as long as the
        producers' disorder stays within what was already seen, and a record written later with an
        older timestamp can always fall below VTTS. A partition that is behind and never reported
        a timestamp makes VTTS unknown.
        """
        self._fold_reports(round_end)
        bounds: list[int] = []
        for position in positions:
            if position.caught_up:
                continue
            seen = self.times.get((position.topic, position.partition))
            if seen is None:
                return None
            bounds.append(seen.max_timestamp_ms - seen.max_disorder_ms - 1)
        if bounds:
            return min(bounds)
        # Everything is delivered: every record seen so far is committed.
        return max((t.max_timestamp_ms for t in self.times.values()), default=None)
