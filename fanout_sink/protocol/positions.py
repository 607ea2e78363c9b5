"""Delivered positions that outlive the sink group's offsets: recovered at start, refreshed while running.

Nobody joins the sink group, so the broker expires each partition's committed offset
``offsets.retention.minutes`` after that partition's last commit (per partition, for a group
without a protocol), even while the app runs, and all of them after a long downtime. A partition
without an offset used to look undelivered: the restart moved Spark's checkpoint aside and started
over from ``source.starting-offsets`` (duplicates under ``earliest``, losses under ``latest``).

Two things keep the position known:

- **Recovery** (start-up planning): a partition with no sink-group offset gets its delivered
  position from the durable record the sink already writes. Each ``DataComplete`` on the control
  topic is committed in the same transaction as the partition's offset, so the largest
  ``next_offset`` per partition IS the delivered position. Retention may have deleted old
  ``DataComplete`` events, but every round's ``CommitComplete`` carries forward the positions of
  all reports below it (``delivered``), and retention only deletes below the last round. Then the
  legacy '-' named group of a deployment that ran before the names changed. The larger of the two
  is restored into the sink group, in a transaction under the partition's worker transactional id
  (fence, stable read, send the offset), so the worker's overlap and gap checks work unchanged.
  Nothing found, and the
  control topic's history complete (it starts at 0, or a retained ``CommitComplete`` covers what
  was deleted): the sink never delivered the partition. Nothing found and the history cut: the
  position is unknown, and planning decides (trust the checkpoint, else the configured start with
  a warning).
- **Refresh** (the coordinator, while running): a partition whose offset has not changed for
  ``interval`` is committed again with the same protocol and the same offset, which restarts its
  retention clock. The interval defaults to a quarter of the broker's ``offsets.retention.minutes``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from fanout_sink.kafka.offsets import GroupOffsets, PartitionPosition
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import SinkChannel

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class Recovery:
    """What start-up planning knows about each source partition."""

    delivered: dict[TopicPartitionKey, int]
    """The sink group's offsets, including the ones just recovered and restored."""
    never_delivered: frozenset[TopicPartitionKey] = frozenset()
    """No offset, nothing recovered, and the control topic's whole history was read."""
    unknown: frozenset[TopicPartitionKey] = frozenset()
    """No offset and nothing recovered, and the control topic no longer proves the whole history."""


def control_topic_positions(sink: SinkChannel) -> tuple[dict[TopicPartitionKey, int], bool]:
    """The delivered position per source partition the control topic still proves, and whether that
    covers the sink's whole history.

    A position is the largest committed ``DataComplete.next_offset`` (committed in the same
    transaction as the offset), or what a ``CommitComplete`` carried forward in ``delivered`` for
    the reports below its ``reports_below``. The history is complete when the log starts at 0, or
    when a ``CommitComplete`` still in the log accounts for every report below the log start
    (retention deletes only what the coordinator acknowledged, which is below the last round).
    """
    reader = channel.ControlReader(sink)
    found: dict[TopicPartitionKey, int] = {}

    def take(key: TopicPartitionKey, offset: int) -> None:
        found[key] = max(found.get(key, 0), offset)

    try:
        log_start, end = reader.watermarks()
        complete = log_start == 0
        if end > log_start:
            reader.seek(log_start)
            for item in reader.read_until(end, sink.scan_timeout_s):
                payload = item.event.payload
                if isinstance(payload, ev.DataComplete):
                    take((payload.topic, payload.partition), payload.next_offset)
                elif isinstance(payload, ev.CommitComplete) and payload.reports_below is not None:
                    for key, offset in ev.delivered_positions(payload).items():
                        take(key, offset)
                    complete = complete or payload.reports_below >= log_start
    finally:
        reader.close()
    return found, complete


class PositionWriter:
    """Commits a partition's delivered position the way a worker does, without records.

    The producer of the partition's worker transactional id fences any older attempt first; the
    stable read after it shows what that attempt finally did. Only if the group still holds what
    the caller expects is the offset sent, so a worker's newer commit is never overwritten.
    """

    def __init__(self, sink: SinkChannel) -> None:
        self.sink = sink
        self._offsets = GroupOffsets(sink.clients, sink.sink_group, stable=True)
        self._metadata = sink.clients.group_metadata(sink.sink_group)

    def commit(self, topic: str, partition: int, offset: int, expected: int | None) -> int | None:
        """Commit ``offset`` if the group holds ``expected``; returns what the group holds afterwards."""
        txn_id = self.sink.worker_transactional_id(topic, partition)
        producer = TransactionalProducer(
            self.sink.clients,
            txn_id,
            fenced_message=(
                f"committing the delivered position {offset} of {topic}[{partition}] was fenced: a "
                f"worker (transactional id {txn_id!r}) took the partition over; it commits the offset."
            ),
        )
        try:
            current = self._offsets.committed([(topic, partition)])[(topic, partition)]
            if current != expected:
                return current
            with producer.transaction():
                producer.send_offsets([TopicPartition(topic, partition, offset)], self._metadata)
            return offset
        finally:
            producer.flush()

    def close(self) -> None:
        self._offsets.close()


def restore_positions(
    sink: SinkChannel, positions: dict[TopicPartitionKey, int], source: str
) -> dict[TopicPartitionKey, int]:
    """Writes positions recovered from ``source`` into the sink group; returns what it holds afterwards."""
    if not positions:
        return {}
    writer = PositionWriter(sink)
    restored: dict[TopicPartitionKey, int] = {}
    try:
        for (topic, partition), offset in sorted(positions.items()):
            held = writer.commit(topic, partition, offset, expected=None)
            if held is not None:  # a worker may have committed meanwhile: then the group is right
                restored[(topic, partition)] = held
            log.warning(
                "sink group %r had no offset for %s[%d] (expired, or not migrated yet): restored the "
                "delivered position %d recovered from %s",
                sink.sink_group,
                topic,
                partition,
                offset,
                source,
            )
    finally:
        writer.close()
    return restored


def recover_positions(
    sink: SinkChannel,
    partitions: list[TopicPartitionKey],
    committed: dict[TopicPartitionKey, int],
) -> Recovery:
    """Fills in the partitions the sink group has no offset for (see the module docstring)."""
    missing = [key for key in partitions if key not in committed]
    if not missing:
        return Recovery(dict(committed))
    from_control, complete = control_topic_positions(sink)
    legacy = GroupOffsets(sink.clients, channel.legacy_sink_group(sink.sink), stable=False)
    try:
        from_legacy = {k: v for k, v in legacy.committed(missing).items() if v is not None}
    finally:
        legacy.close()
    control_source = f"the control topic {sink.control_topic!r} (DataComplete events)"
    legacy_source = f"the legacy group {channel.legacy_sink_group(sink.sink)!r} (migrated)"
    delivered = dict(committed)
    for source, found in ((control_source, from_control), (legacy_source, from_legacy)):
        # The larger of the two wins: each is a position some committed transaction delivered.
        best = {
            k: v
            for k, v in found.items()
            if k in missing and v >= max(from_control.get(k, 0), from_legacy.get(k, 0))
        }
        best = {k: v for k, v in best.items() if k not in delivered}
        delivered.update(restore_positions(sink, best, source))
    left = frozenset(key for key in missing if key not in delivered)
    if not complete:
        return Recovery(delivered, unknown=left)
    return Recovery(delivered, never_delivered=left)


@dataclass
class OffsetRefresher:
    """Re-commits the offsets of partitions that have not committed for ``interval_s``.

    The sink group's committed offsets come from the coordinator's round (``source_positions``). A
    partition counts as committed "now" when it is first seen and whenever its offset changes; a
    refresh is due ``interval_s`` later. Only caught-up partitions are refreshed: one with records
    waiting is about to be committed by a worker, and refreshing it would fence that worker.
    """

    sink: SinkChannel
    interval_s: float
    _seen: dict[TopicPartitionKey, tuple[int, float]] = field(default_factory=dict)

    def refresh(self, positions: list[PartitionPosition]) -> list[TopicPartitionKey]:
        """Refreshes what is due; returns the partitions whose offset was committed again."""
        now = time.monotonic()
        due: list[PartitionPosition] = []
        for position in positions:
            key = (position.topic, position.partition)
            last = self._seen.get(key)
            if position.committed is None:
                self._seen.pop(key, None)
            elif last is None or last[0] != position.committed:
                self._seen[key] = (position.committed, now)
            elif now - last[1] >= self.interval_s and position.caught_up:
                due.append(position)
        if not due:
            return []
        refreshed: list[TopicPartitionKey] = []
        writer = PositionWriter(self.sink)
        try:
            for position in due:
                key = (position.topic, position.partition)
                offset = position.committed
                assert offset is not None
                if writer.commit(position.topic, position.partition, offset, expected=offset) == offset:
                    refreshed.append(key)
                self._seen[key] = (offset, time.monotonic())
        finally:
            writer.close()
        log.info(
            "re-committed the unchanged offsets of %s so that the broker does not expire them",
            ", ".join(f"{t}[{p}]" for t, p in refreshed) or "no partition",
        )
        return refreshed
