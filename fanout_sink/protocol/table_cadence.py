"""Per-table commit cadence: which of a round's tables commit now, and which keep their files pending.

A table without a ``commit-interval`` of its own commits in every round, as before. A table with one
(its route's, or ``dynamic``'s for the tables it names) commits in the first round of each period of
that length; in the rounds between, its files wait on the control topic. So a cold table gathers
rows for minutes into one snapshot (and, merged at its commit, fewer files:
:mod:`~fanout_sink.protocol.file_merge`) while the hot ones commit every round.

The periods are counted from the Unix epoch shifted by a *phase* of the table's own (:func:`phase_ms`:
a hash of its name modulo the interval, the same in every process and at every start), so the tables
of one interval take turns across it instead of all committing in one round. Counted from the epoch
alone, every table of an interval was due in the same round (the *herd*): at 1,000 tables with 950 of
them on a 150 s interval, that round merged and committed 950 tables, ran into
``control.commit-timeout`` with 684 of them failed (an ERROR each) and held the hot tables' next commit
back by two minutes of a 30 s cadence (docs/benchmarks/wide-sinks.md, "Per-table cadence"). With the
phase each round commits about ``round / interval`` of them. The price: a round in which any table
waits is no consistent point for ``sql --consistent``, and with the phases spread some table of an
interval waits in nearly every round while they all receive data.

Exactly-once does not depend on when a table commits: its files stay in the coordinator's pending
state and hold the control topic's low watermark, as a failing table's do
(:mod:`~fanout_sink.protocol.failing_tables`), so a restart re-reads them from there, and every
table's floor skips what it holds already. A table's VTTS (its summary's) advances only when it
commits: it then holds every file below that round's end, so the round's VTTS is true for it.

A table is due in a round when one of its period boundaries lies between the round and the earlier
of its oldest pending file's write and the previous round that ran its commits: the first round of
its period takes it, and files older than the period are due at any round (after a restart, or a
round that failed). A table whose commit failed is due again every round, and a stop's final round
commits every table.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol import round_trigger as trigger
from fanout_sink.protocol.commit_state import PendingFiles


@dataclass(frozen=True)
class CommitIntervals:
    """Each table's own ``commit-interval`` in seconds, as the config says it; picklable."""

    declared: Mapping[str, float | None] = field(default_factory=dict)
    """Every table under ``tables:``, with its own interval or None (every round)."""
    dynamic_s: float | None = None
    """``dynamic.commit-interval``: every table not declared."""

    @classmethod
    def of(cls, config: SinkConfig) -> CommitIntervals:
        def seconds(table: str) -> float | None:
            interval = config.commit_interval_for(table)
            return None if interval is None else interval.total_seconds()

        dynamic = config.dynamic.commit_interval if config.dynamic is not None else None
        dynamic_s = None if dynamic is None else dynamic.total_seconds()
        # A declared table without one is named only where it must not take dynamic's.
        declared = {table: seconds(table) for table in config.tables}
        return cls({t: s for t, s in declared.items() if s is not None or dynamic_s is not None}, dynamic_s)

    def interval_s(self, table: str) -> float | None:
        """The table's own interval; None: it commits in every round."""
        return self.declared.get(table, self.dynamic_s)


def phase_ms(table: str, interval_s: float) -> int:
    """Where ``table``'s periods of ``interval_s`` begin, in milliseconds past each multiple of the
    interval from the Unix epoch: a hash of the name (not Python's ``hash``, which differs per
    process) modulo the interval, so every process and every start agrees, and the tables of one
    interval fall evenly over it."""
    digest = hashlib.blake2b(table.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % max(1, round(interval_s * 1000))


def period(at_s: float, interval_s: float, phase_s: float = 0.0) -> int:
    """Which period of ``interval_s`` (counted from the Unix epoch plus ``phase_s``) the time ``at_s``
    falls in."""
    return math.floor((at_s - phase_s) / interval_s)


def due_ms(table: str, interval_s: float, oldest_written_ms: int, now_ms: int) -> int:
    """When ``table``'s pending files written at ``oldest_written_ms`` are due: the end of their period
    (the first round from then on commits them); a time before ``now_ms`` says: at the next round."""
    phase = phase_ms(table, interval_s)
    return (period(oldest_written_ms / 1000, interval_s, phase / 1000) + 1) * round(interval_s * 1000) + phase


class TableCadence:
    """The coordinator's use of :class:`CommitIntervals`: a round's due tables split into those that
    commit now and those whose files wait (:meth:`split`), told when a round ran its commits
    (:meth:`ran`). ``clock``: wall-clock seconds, as the events' write times are."""

    def __init__(self, intervals: CommitIntervals, clock: Callable[[], float] = time.time) -> None:
        self.intervals = intervals
        self._clock = clock
        self._last_round_s = clock()
        """When the previous round that ran its table commits started (this process's start at first)."""

    def now(self) -> float:
        return self._clock()

    def split(
        self,
        due: dict[str, list[PendingFiles]],
        now_s: float,
        reason: str,
        failing: Collection[str] = (),
    ) -> tuple[dict[str, list[PendingFiles]], dict[str, list[PendingFiles]]]:
        """``due`` (the round's pending files per table) as the tables that commit now and those
        that wait for their period."""
        if reason == trigger.STOP:
            return due, {}
        now, waiting = {}, {}
        for table, items in due.items():
            if table in failing or self._due(table, items, now_s):
                now[table] = items
            else:
                waiting[table] = items
        return now, waiting

    def _due(self, table: str, items: list[PendingFiles], now_s: float) -> bool:
        interval = self.intervals.interval_s(table)
        if interval is None:
            return True
        written = [p.written_ms / 1000 for p in items if p.written_ms is not None]
        since = min([self._last_round_s, *written])
        phase = phase_ms(table, interval) / 1000
        return period(now_s, interval, phase) > period(since, interval, phase)

    def merging(self, tables: Collection[str]) -> frozenset[str]:
        """The tables of ``tables`` with an interval of their own: their small files are merged at commit."""
        return frozenset(t for t in tables if self.intervals.interval_s(t) is not None)

    def ran(self, started_s: float) -> None:
        """A round that started at ``started_s`` ran its table commits."""
        self._last_round_s = started_s
