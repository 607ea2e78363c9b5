"""What the sink keeps in the metadata string of a committed offset: one typed value per group.

Kafka stores a free-form string (the *offset metadata*) with every committed offset. The sink uses
it in three of its consumer groups, each for a different payload, and encodes and decodes each
payload here only, so the wire form has one place (``tests/protocol/test_offset_metadata.py`` pins
each encoded string):

- the sink group: :class:`DeliveredBy`, the transactional id whose transaction committed the offset
  (written by ``recovery.send_delivered``; read when the partition-group layout changes,
  :mod:`.group_layout`);
- the layout group: :class:`LayoutRecord`, the partition-group layout in use and the start that
  recorded it (:mod:`.group_layout`);
- the coordinator group: :class:`RoundMark`, what the round that committed the low watermark leaves
  for a restart that finds the events before it deleted (:mod:`.control_tail`, ``recovery``).

Not to be confused with *group metadata*: the opaque bytes (``KafkaClientFactory.group_metadata``)
a transactional producer sends beside the offsets to say which group they are committed for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fanout_sink.protocol.partition_groups import PartitionGroups


@dataclass(frozen=True)
class DeliveredBy:
    """The sink group's offset metadata: the transactional id that delivered up to the offset, so a
    start under another partition-group layout knows which ids to fence."""

    transactional_id: str

    def encode(self) -> str:
        return self.transactional_id

    @classmethod
    def decode(cls, offset_metadata: str | None) -> DeliveredBy | None:
        """None for an offset committed without a name: by a sink before packing, whose workers used
        each partition's own transactional id."""
        return cls(offset_metadata) if offset_metadata else None


@dataclass(frozen=True)
class LayoutRecord:
    """The layout group's offset metadata: the partition-group layout the last start recorded, the
    start that recorded it, and the earlier layouts whose transactional ids that start has yet to
    fence (a start that stops between recording and fencing leaves them to the next one)."""

    KEY = "partition-groups"

    layout: PartitionGroups
    start: str | None = None
    """The recording start's id (``SinkChannel.start_id``); None from a start before issue 47."""
    unfenced: tuple[PartitionGroups, ...] = ()

    def encode(self) -> str:
        record: dict[str, object] = {self.KEY: self.layout.count}
        if self.start is not None:
            record["start"] = self.start
        if self.unfenced:
            record["unfenced"] = [layout.count for layout in self.unfenced]
        return json.dumps(record)

    @classmethod
    def decode(cls, offset_metadata: str | None) -> LayoutRecord | None:
        """None for an offset committed without a record."""
        if not offset_metadata:
            return None
        record = json.loads(offset_metadata)
        unfenced = tuple(PartitionGroups(count) for count in record.get("unfenced", []))
        return cls(PartitionGroups(record[cls.KEY]), record.get("start"), unfenced)


@dataclass(frozen=True)
class RoundMark:
    """The coordinator group's offset metadata: what a round leaves beside the low watermark.

    ``round_end`` is the control offset the round read up to, ``log_end`` the log end its own
    transaction leaves when nothing else is written meanwhile (its events and the commit marker
    after ``round_end``).
    """

    round_end: int
    log_end: int

    @classmethod
    def of_round(cls, round_end: int, events: int) -> RoundMark:
        """The mark of a round ending at ``round_end`` whose transaction writes ``events`` events."""
        return cls(round_end, round_end + events + 1)

    def moved_to(self, log_start: int) -> RoundMark:
        """The mark of a low watermark moved up to ``log_start`` past deleted events that
        :meth:`nothing_needed_below` found unneeded: still nothing may be written after ``log_end``."""
        return RoundMark(log_start, self.log_end)

    def encode(self) -> str:
        return json.dumps({"round_end": self.round_end, "log_end": self.log_end}, separators=(",", ":"))

    @classmethod
    def decode(cls, offset_metadata: str | None) -> RoundMark | None:
        """The mark in a committed offset's metadata; None for an offset committed without one."""
        try:
            found = json.loads(offset_metadata or "")
            return cls(int(found["round_end"]), int(found["log_end"]))
        except (ValueError, TypeError, KeyError):
            return None

    def nothing_needed_below(self, low_watermark: int, log_end: int) -> bool:
        """Whether every event below ``log_end`` is in its tables or is round bookkeeping.

        True when the round that committed ``low_watermark`` left nothing pending (its low watermark
        is its round end) and nothing was written to the control topic after it (the log still ends
        where its transaction ended: no worker delivered, no attempt aborted, no round started).
        """
        return low_watermark == self.round_end and log_end == self.log_end
