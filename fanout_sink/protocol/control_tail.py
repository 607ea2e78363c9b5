"""The bounded tail of the control topic that start-up recovery reads.

Recovery used to read the control topic from its log start, so the topic had to keep every event
and start-up time grew with the sink's age. What recovery needs is much less (docs/design.md,
"The control topic's tail"):

- **Delivered positions.** Every round's ``CommitComplete`` carries forward, in ``delivered``, the
  largest ``DataComplete.next_offset`` of every report below its ``reports_below`` (and of every
  earlier round's ``delivered``). So the newest *whole* round (all its parts) whose
  ``reports_below`` lies inside the part of the log read, plus the reports from there on, give the
  same positions as the whole history. :func:`read_tail` finds it by reading back from the end in
  growing windows: about one round's events, whatever the topic's age.
- **Where the coordinator resumes.** The coordinator group's low watermark (committed with the
  last round), or else the ``low_watermark`` the newest ``CommitComplete`` of the tail recorded.
- **Whether deleted events were needed.** A sink down longer than the topic's retention finds
  even its last round deleted. The round's :class:`~.offset_metadata.RoundMark`, committed as the
  metadata of the coordinator group's offset (which outlives the topic's retention), tells whether
  the deleted events held anything a table still needed: nothing was pending at that round, and
  nothing was written after it. The log end proves the second: it is exactly where that round's
  own transaction ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import ControlReader, SinkChannel

log = logging.getLogger(__name__)

TAIL_WINDOW = 4096
"""Control offsets read back from the end at first; each miss reads four times as far back."""


@dataclass(frozen=True)
class ControlTail:
    """What the tail of the control topic says, and how much of it was read."""

    positions: ev.DeliveredPositions
    complete: bool
    """The positions account for the sink's whole history: the log starts at 0, or a whole round
    read accounts for every report before the part read."""
    low_watermark: int | None
    """The low watermark the newest ``CommitComplete`` read recorded (None: no round read)."""
    read_from: int
    events: int
    """This sink's events read."""


def read_tail(channel: SinkChannel) -> ControlTail:
    """The control topic's tail back to its newest whole round (see the module docstring).

    Keeps I1 when the sink group lost offsets: the positions are those the whole history gives,
    read from a bounded tail. Only a topic holding no whole round is read from its log start.
    """
    reader = ControlReader(channel)
    try:
        log_start, end = reader.watermarks()
        window = TAIL_WINDOW
        while True:
            start = max(log_start, end - window)
            tail = _read(reader, start, end, log_start)
            if tail.complete or start == log_start:
                log.debug("read control offsets %d..%d (%d events) for recovery", start, end, tail.events)
                return tail
            window *= 4
    finally:
        reader.close()


def _read(reader: ControlReader, start: int, end: int, log_start: int) -> ControlTail:
    positions: list[tuple[tuple[int, int, int], ev.DataComplete | ev.CommitComplete]] = []
    parts_seen: dict[str, set[int]] = {}
    complete = start == 0
    low_watermark: int | None = None
    events = 0
    if end > start:
        reader.seek(start)
        for item in reader.read_until(end, reader.channel.scan_timeout_s):
            events += 1
            payload = item.event.payload
            if isinstance(payload, ev.DataComplete):
                positions.append(((item.offset, 1, item.offset), payload))
            elif isinstance(payload, ev.CommitComplete) and payload.reports_below is not None:
                positions.append(((payload.reports_below, 0, item.offset), payload))
                low_watermark = payload.low_watermark if payload.low_watermark is not None else low_watermark
                # A round in parts accounts for the history only once every part was read.
                seen = parts_seen.setdefault(payload.commit_id, set())
                seen.add(payload.part)
                whole = len(seen) == payload.parts
                complete = complete or (whole and payload.reports_below >= max(start, log_start))
    return ControlTail(_positions(positions), complete, low_watermark, start, events)


def _positions(
    read: list[tuple[tuple[int, int, int], ev.DataComplete | ev.CommitComplete]],
) -> ev.DeliveredPositions:
    """The positions of the reports and rounds ``read``, each round as of its ``reports_below``: it
    holds the reports below that offset and none above, yet is written after the round's commits, so
    reports written meanwhile come before it in the log. Taken in offset order, a recreated topic's
    first report there was undone by the round's older generation (issue 47 item 7 (iii)); so a
    round goes where its ``reports_below`` is, before the reports at that offset and after."""
    found = ev.DeliveredPositions()
    for _, payload in sorted(read, key=lambda entry: entry[0]):
        if isinstance(payload, ev.DataComplete):
            found.take_report(payload)
        else:
            found.take_round(payload)
    return found
