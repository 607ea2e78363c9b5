"""When the coordinator's next commit round is due: a planned micro-batch fully reported, or the interval.

A round on a timer makes every batch wait for it: with a 10 s ``control.commit-interval``, a record
became visible up to a whole interval after its batch had written it. Instead the driver tells the
trigger which ranges each micro-batch planned (:meth:`RoundTrigger.expect`), the coordinator tells
it every ``DataComplete`` it reads (:meth:`RoundTrigger.observe`), and a round is due as soon as
every planned range of a batch has reported its end offset. ``control.commit-interval`` stays the
upper bound (a round runs at least that often, data or not: VTTS and idle offsets advance with it),
and ``control.commit-min-interval`` the floor between two rounds' starts, so that back-to-back small
batches (a backlog, a short trigger) cannot turn into a snapshot per table every few hundred
milliseconds.

Exactly-once does not depend on any of this: a round commits whatever committed events lie below the
control topic's last stable offset, whenever it runs. The trigger only decides *when*; a batch whose
reports never arrive (its ranges were delivered by an earlier run, the driver stopped) is picked up
by the interval. The driver's own word that a batch finished is not enough: a transaction's events
become readable only once the broker has written its markers, which may be just after the commit
returned, so only the reports read (or the driver naming the slices that had nothing to deliver)
complete a batch.

All methods are thread-safe: the driver's batch thread plans, the coordinator's thread observes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import ControlEvent

BATCH_COMPLETE = "batch-complete"
"""Every planned range of a micro-batch reported (or was delivered before, as the driver learnt)."""
INTERVAL = "interval"
"""``control.commit-interval`` passed since the last round started."""
STOP = "stop"
"""The final round of a stop (shutdown, end of an available-now run)."""
CALL = "call"
"""Run by a direct ``commit_round()`` call (tools, tests)."""
REASONS = (BATCH_COMPLETE, INTERVAL, STOP, CALL)

Ranges = Mapping[tuple[str, int], tuple[int, int]]
"""``{(topic, partition): (start, end)}`` as the driver planned them (``spark.planning.PlannedRanges``)."""


@dataclass
class _Expected:
    """One planned batch: the end offset each moved range must report, and how far it got."""

    ends: dict[tuple[str, int], int]
    reported_at: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per range, the control offset of the report that covered it (-1: delivered before, no new report)."""
    finished: bool = False
    """The driver's batch returned: its transactions committed, its reports are on their way."""

    def complete(self) -> bool:
        return len(self.reported_at) == len(self.ends)

    def covered_below(self, round_end: int) -> bool:
        """Whether a round whose end is ``round_end`` holds every event of this batch."""
        return self.complete() and max(self.reported_at.values(), default=-1) < round_end


class RoundTrigger:
    """Decides the reason for the coordinator's next round, or that none is due yet."""

    def __init__(
        self,
        interval_s: float,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.min_interval_s = min(min_interval_s, interval_s)  # the default floor may exceed a short interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_start = clock()
        self._expected: dict[int, _Expected] = {}
        self._reported = ev.DeliveredPositions()
        """Per source partition, the largest ``next_offset`` reported for the topic's newest generation."""
        self._taken: list[int] = []
        """Batches complete when the running round started: that round holds their events."""

    # -- what the driver and the control topic say -------------------------------------------------

    def expect(self, batch_id: int, ranges: Ranges) -> None:
        """The driver planned ``batch_id`` (again, on a retry). Ranges that did not move report nothing."""
        ends = {key: end for key, (start, end) in ranges.items() if end > start}
        if not ends:  # an empty batch (an idle trigger) is no reason for a round
            return
        with self._lock:
            expected = _Expected(ends)
            for key, end in ends.items():
                if self._reported.offsets.get(key, -1) >= end:  # delivered before it was planned (a replay)
                    expected.reported_at[key] = -1
            self._expected[batch_id] = expected

    def delivered_before(self, batch_id: int, ranges: Iterable[tuple[str, int]]) -> None:
        """Slices of ``batch_id`` that found their range in the sink group already and so wrote no
        report (a batch replayed after a crash, or retried after some of its slices committed)."""
        with self._lock:
            if (expected := self._expected.get(batch_id)) is not None:
                for key in ranges:
                    if key in expected.ends:
                        expected.reported_at.setdefault(key, -1)

    def finished(self, batch_id: int) -> None:
        """The driver's batch ``batch_id`` returned: every report it wrote is committed, though maybe
        not readable yet (its markers). A final round waits for those (:meth:`unreported`)."""
        with self._lock:
            if (expected := self._expected.get(batch_id)) is not None:
                expected.finished = True

    def unreported(self) -> list[int]:
        """Batches the driver finished whose reports are not all read yet: a stop's final round that
        ran now would leave their files to the next start."""
        with self._lock:
            return sorted(b for b, e in self._expected.items() if e.finished and not e.complete())

    def observe(self, item: ControlEvent) -> None:
        """A committed control event of this sink, read by the coordinator (in control-topic order)."""
        payload = item.event.payload
        with self._lock:
            if isinstance(payload, ev.DataComplete):
                self._reported.take_report(payload)
                touched = [(payload.topic, payload.partition)]
            elif isinstance(payload, ev.CommitComplete):  # a restarted coordinator re-reads older rounds
                self._reported.take_round(payload)
                touched = list(ev.delivered_positions(payload))
            else:
                return
            for key in touched:
                offset = self._reported.offsets.get(key, -1)
                for expected in self._expected.values():
                    end = expected.ends.get(key)
                    if end is not None and offset >= end and key not in expected.reported_at:
                        expected.reported_at[key] = item.offset

    # -- what the coordinator asks -----------------------------------------------------------------

    def due(self) -> str | None:
        """The reason a round should start now, or None."""
        with self._lock:
            since = self._clock() - self._last_start
            if since >= self.interval_s:
                return INTERVAL
            if since >= self.min_interval_s and any(e.complete() for e in self._expected.values()):
                return BATCH_COMPLETE
            return None

    def started(self) -> None:
        """A round starts (any reason): the interval and the minimum count from now, and the batches
        complete now are that round's (their events are committed before it reads the control end)."""
        with self._lock:
            self._last_start = self._clock()
            self._taken = [batch for batch, expected in self._expected.items() if expected.complete()]

    def done(self, round_end: int) -> None:
        """The round that last :meth:`started` committed everything below ``round_end``: forget the
        batches it held. A failed round calls nothing, so its batches stay due."""
        with self._lock:
            for batch in list(self._expected):
                if batch in self._taken or self._expected[batch].covered_below(round_end):
                    del self._expected[batch]
            self._taken = []

    def pending_batches(self) -> list[int]:
        """Planned batches no successful round has held yet (for logs and tests)."""
        with self._lock:
            return sorted(self._expected)
