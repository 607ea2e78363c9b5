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
    # Reports not folded into a round yet, and per (topic, partition) the max timestamp of reports
    # that were (their records are committed once the round's tables are).
    reports: list[tuple[int, ev.DataComplete]] = field(default_factory=list)
    max_timestamp_ms: dict[tuple[str, int], int] = field(default_factory=dict)

    def add(self, item: ControlEvent) -> None:
        payload = item.event.payload
        if isinstance(payload, ev.DataWritten):
            self.pending.setdefault(payload.table.identifier, []).append(
                PendingFiles(item.offset, payload, item.event.event_time_ms)
            )
        elif isinstance(payload, ev.DataComplete):
            self.reports.append((item.offset, payload))

    def _fold_reports(self, round_end: int) -> None:
        later = []
        for offset, report in self.reports:
            if offset >= round_end:
                later.append((offset, report))
            elif report.max_timestamp_ms is not None:
                key = (report.topic, report.partition)
                self.max_timestamp_ms[key] = max(self.max_timestamp_ms.get(key, 0), report.max_timestamp_ms)
        self.reports = later

    def due(self, round_end: int) -> dict[str, list[PendingFiles]]:
        """Per table, the pending files read below ``round_end`` (later ones wait for the next round)."""
        due = {t: [p for p in items if p.offset < round_end] for t, items in self.pending.items()}
        return {t: items for t, items in sorted(due.items()) if items}

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
        """Minimum over source partitions of the maximum committed record timestamp.

        ``positions`` must be read before the round's control end offset is taken, so that whatever
        the sink group had committed then has its events inside the round. A caught-up partition
        (committed = end) does not hold VTTS back. A partition that is behind and never reported a
        timestamp makes VTTS unknown (None): nothing can be said about its unread records.
        """
        self._fold_reports(round_end)
        bounds: list[int] = []
        for position in positions:
            if position.caught_up:
                continue
            seen = self.max_timestamp_ms.get((position.topic, position.partition))
            if seen is None:
                return None
            bounds.append(seen)
        if bounds:
            return min(bounds)
        # Everything is delivered: every record seen so far is committed.
        return max(self.max_timestamp_ms.values(), default=None)
