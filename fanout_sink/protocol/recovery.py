"""Where a source partition's delivered position comes from, and the one writer of the sink group.

The sink-managed group is the source of truth about what was delivered (invariant I1), and this
module is the only code that writes it: the worker's transactional offset commit goes through
:func:`send_delivered`, recovery restores positions with :class:`PositionWriter`, and the
coordinator's :class:`~.offset_refresh.OffsetRefresher` re-commits idle ones with it.
``tests/test_architecture.py`` checks that no other module sends offsets with the sink group's
metadata. The planner, the worker and the coordinator ask this module where to start; the
coordinator group (a different group: how far the coordinator read the control topic) is resumed
here too (:func:`seek_to_low_watermark`), while the coordinator commits its own group itself.

Nobody joins the sink group, so the broker expires each partition's committed offset
``offsets.retention.minutes`` after that partition's last commit (per partition, for a group
without a protocol), even while the app runs, and all of them after a long downtime. A partition
without an offset used to look undelivered: the restart moved Spark's checkpoint aside and started
over from ``source.starting-offsets`` (duplicates under ``earliest``, losses under ``latest``).

Two things keep the position known:

- **Recovery** (start-up planning, and a worker whose partition's offset vanished): a partition
  with no sink-group offset gets its delivered position from the durable record the sink already
  writes. Each ``DataComplete`` on the control topic is committed in the same transaction as the
  partition's offset, so the largest ``next_offset`` per partition IS the delivered position.
  Retention may have deleted old ``DataComplete`` events, but every round's ``CommitComplete``
  carries forward the positions of all reports below it (``delivered``), and retention only deletes
  below the last round. Then the legacy '-' named group of a deployment that ran before the names
  changed (:mod:`legacy_names`). The larger of the two is restored into the sink group, in a
  transaction under the partition's worker transactional id (fence, stable read, send the offset),
  so the worker's overlap and gap checks work unchanged. Nothing found, and the control topic's
  history complete (it starts at 0, or a retained ``CommitComplete`` covers what was deleted): the
  sink never delivered the partition. Nothing found and the history cut: the position is unknown,
  and planning decides (trust the checkpoint, else the configured start with a warning).
- **A recreated topic** (deleted and created again under the same name): the broker drops the sink
  group's offsets with the old topic, but the control topic still holds the old topic's positions.
  Each one carries the topic id it was read from (event version 4), and a position of another id
  than the topic has now is not this topic's: it is never restored. ``source.recreated-topic-offsets``
  says what happens instead: ``earliest`` reads the new topic from its beginning (planning moves a
  checkpoint that holds the old positions aside), ``fail`` stops with :class:`TopicRecreatedError`.
- **Refresh** (the coordinator, while running): idle partitions' offsets are committed again
  through :class:`PositionWriter` before they expire (:mod:`.offset_refresh`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from fanout_sink.errors import TopicRecreatedError
from fanout_sink.kafka.offsets import GroupOffsets, log_start_offset
from fanout_sink.kafka.topics import topic_ids
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import group_layout
from fanout_sink.protocol.channel import ControlReader, SinkChannel
from fanout_sink.protocol.control_tail import read_tail
from fanout_sink.protocol.legacy_names import legacy_low_watermark, legacy_sink_group, legacy_sink_positions
from fanout_sink.protocol.offset_metadata import DeliveredBy, RoundMark
from fanout_sink.protocol.slices import Slice

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
    recreated: frozenset[TopicPartitionKey] = frozenset()
    """No offset, and the positions recorded are of another topic id: the topic was recreated and
    is read from its beginning (``source.recreated-topic-offsets: earliest``)."""


# -- the sink group's offsets ----------------------------------------------------------------------


def sink_group_metadata(channel: SinkChannel) -> bytes:
    """The generation -1 metadata every sink-group offset commit carries (I3: nobody joins the
    group, so the broker accepts these commits only from transactional producers)."""
    return channel.clients.group_metadata(channel.sink_group)


def send_delivered(
    producer: TransactionalProducer, group_metadata: bytes, delivered: Mapping[TopicPartitionKey, int]
) -> None:
    """Send each partition's delivered position inside the producer's open transaction.

    Keeps I1 and I2: the offset commits or aborts together with the events and dead letters of the
    same transaction, so the sink group never holds a position whose records are not announced.
    ``offset`` is the planned end (never last record + 1: offsets have holes). The offset's metadata
    names the producer's transactional id (:class:`~.offset_metadata.DeliveredBy`), so a start under
    another partition-group layout knows which ids delivered last and fences them (:mod:`.group_layout`).
    ``group_metadata`` is the sink group's (:func:`sink_group_metadata`).
    """
    delivered_by = DeliveredBy(producer.transactional_id).encode()
    offsets = [TopicPartition(t, p, offset, metadata=delivered_by) for (t, p), offset in delivered.items()]
    producer.send_offsets(offsets, group_metadata)


def delivered_offsets(
    channel: SinkChannel, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """What the sink group says was delivered, read without waiting for open transactions.

    Only where Spark starts reading depends on it: an answer that is too low (a transaction still
    pending) is harmless for I1, because each worker fences, reads stably and skips what is delivered.
    """
    reader = GroupOffsets(channel.clients, channel.sink_group, stable=False)
    try:
        found = reader.committed(partitions)
    finally:
        reader.close()
    return {key: value for key, value in found.items() if value is not None}


class PositionWriter:
    """Commits a partition's delivered position the way a worker does, without records.

    Keeps I1 and I3: the producer of the partition's worker transactional id fences any older
    attempt first, and a writer of a start a later one superseded stops
    (``group_layout.check_still_recorded``: its offset could move back one the later start's worker
    committed); the stable read after it shows what that attempt finally did. Only if the group
    still holds what the caller expects is the offset sent, so a worker's newer commit is never
    overwritten.
    """

    def __init__(self, channel: SinkChannel) -> None:
        self.channel = channel
        self._offsets = GroupOffsets(channel.clients, channel.sink_group, stable=True)
        self._group_metadata = sink_group_metadata(channel)

    def commit(self, topic: str, partition: int, offset: int, expected: int | None) -> int | None:
        """Commit ``offset`` if the group holds ``expected``; returns what the group holds afterwards."""
        txn_id = self.channel.worker_transactional_id(topic, partition)
        producer = TransactionalProducer(
            self.channel.clients,
            txn_id,
            fenced_message=(
                f"committing the delivered position {offset} of {topic}[{partition}] was fenced: a "
                f"worker (transactional id {txn_id!r}) took the partition over; it commits the offset."
            ),
        )
        try:
            group_layout.check_still_recorded(self.channel)  # a superseded start's refresher stops here
            current = self._offsets.committed([(topic, partition)])[(topic, partition)]
            if current != expected:
                return current
            with producer.transaction():
                send_delivered(producer, self._group_metadata, {(topic, partition): offset})
            return offset
        finally:
            producer.flush()

    def close(self) -> None:
        self._offsets.close()


# -- recovering positions the group lost -----------------------------------------------------------


def control_topic_positions(channel: SinkChannel) -> tuple[ev.DeliveredPositions, bool]:
    """The delivered position per source partition the control topic still proves (with the topic id
    they were read from, :class:`~fanout_sink.protocol.events.DeliveredPositions`), and whether that
    covers the sink's whole history.

    Keeps I1 when the sink group lost offsets: a position is the largest committed
    ``DataComplete.next_offset`` (committed in the same transaction as the offset, I2), or what a
    ``CommitComplete`` carried forward in ``delivered`` for the reports below its ``reports_below``.
    Read from the topic's tail back to its newest whole round (:func:`control_tail.read_tail`), which
    gives what the whole history gives; the history is complete when the log starts at 0, or when
    a whole round read accounts for every report before the part read.
    """
    tail = read_tail(channel)
    return tail.positions, tail.complete


def restore_positions(
    channel: SinkChannel, positions: dict[TopicPartitionKey, int], source: str
) -> dict[TopicPartitionKey, int]:
    """Writes positions recovered from ``source`` into the sink group; returns what it holds afterwards.

    Keeps I1: a partition a worker committed meanwhile keeps the worker's offset (``expected=None``).
    """
    if not positions:
        return {}
    writer = PositionWriter(channel)
    restored: dict[TopicPartitionKey, int] = {}
    try:
        for (topic, partition), offset in sorted(positions.items()):
            held = writer.commit(topic, partition, offset, expected=None)
            if held is not None:  # a worker may have committed meanwhile: then the group is right
                restored[(topic, partition)] = held
            log.warning(
                "sink group %r had no offset for %s[%d] (expired, or not migrated yet): restored the "
                "delivered position %d recovered from %s",
                channel.sink_group,
                topic,
                partition,
                offset,
                source,
            )
    finally:
        writer.close()
    return restored


def recreated_topics(
    channel: SinkChannel, recorded: ev.DeliveredPositions, topics: set[str]
) -> dict[str, tuple[str, str]]:
    """Of ``topics``, those whose recorded positions were read under another topic id than the topic
    has now: topic -> (recorded id, current id). Positions without an id (events before version 4)
    cannot tell, and count as this topic's."""
    current = topic_ids(channel.clients, topics)
    found: dict[str, tuple[str, str]] = {}
    for topic in sorted(topics):
        recorded_id = recorded.recorded_id(topic)
        if recorded_id is not None and topic in current and current[topic] != recorded_id:
            found[topic] = (recorded_id, current[topic])
    return found


def recover_positions(
    channel: SinkChannel, partitions: list[TopicPartitionKey], on_recreated: str = "earliest"
) -> Recovery:
    """The sink group's offsets of ``partitions``, with the missing ones recovered and restored (the
    planner's start; see the module docstring). Keeps I1 across offset expiry, the rename and a
    recreated topic (``on_recreated``: ``source.recreated-topic-offsets``)."""
    committed = delivered_offsets(channel, partitions)
    missing = [key for key in partitions if key not in committed]
    if not missing:
        return Recovery(dict(committed))
    recorded, complete = control_topic_positions(channel)
    recreated = recreated_topics(channel, recorded, {topic for topic, _ in missing})
    for topic, (old_id, new_id) in recreated.items():
        if on_recreated == "fail":
            raise TopicRecreatedError(topic, old_id, new_id)
        log.warning(
            "source topic %r was deleted and recreated (topic id %s, delivered up to %s, is now %s): "
            "reading the new topic from its beginning (source.recreated-topic-offsets: earliest)",
            topic,
            old_id,
            {f"{t}[{p}]": o for (t, p), o in sorted(recorded.of_topic(topic).items())},
            new_id,
        )
    legacy = legacy_sink_positions(channel, missing)
    from_control = {key: offset for key, offset in recorded.offsets.items() if key[0] not in recreated}
    from_legacy = {key: offset for key, offset in legacy.items() if key[0] not in recreated}
    control_source = f"the control topic {channel.control_topic!r} (DataComplete events)"
    legacy_source = f"the legacy group {legacy_sink_group(channel.sink)!r} (migrated)"
    delivered = dict(committed)
    for source, found in ((control_source, from_control), (legacy_source, from_legacy)):
        # The larger of the two wins: each is a position some committed transaction delivered.
        best = {
            k: v
            for k, v in found.items()
            if k in missing and k not in delivered and v >= max(from_control.get(k, 0), from_legacy.get(k, 0))
        }
        delivered.update(restore_positions(channel, best, source))
    again = frozenset(key for key in missing if key[0] in recreated)
    left = frozenset(key for key in missing if key not in delivered) - again
    if not complete:
        return Recovery(delivered, unknown=left, recreated=again)
    return Recovery(delivered, never_delivered=left, recreated=again)


def known_positions(
    channel: SinkChannel,
    found: Recovery,
    checkpoint_ends: dict[TopicPartitionKey, int],
    starting_offsets: str,
) -> dict[TopicPartitionKey, int]:
    """The delivered positions the planner may start from: ``found.delivered``, plus Spark's
    checkpoint's for the partitions whose position is unknown (restored into the sink group).

    Keeps I1 as far as anything still proves it: a batch in the checkpoint's ``commits/`` was
    delivered in full, so its end is a delivered position. A partition neither the group, the
    control topic nor the checkpoint knows starts from ``source.starting-offsets`` with a WARNING,
    since that may duplicate or skip records.
    """
    trusted = {key: checkpoint_ends[key] for key in found.unknown if key in checkpoint_ends}
    for topic, part in sorted(trusted):
        log.warning(
            "%s[%d]: the sink group has no offset and the control topic %r no longer holds its history "
            "(log start > 0); trusting Spark's checkpoint, which delivered up to %d",
            topic,
            part,
            channel.control_topic,
            trusted[(topic, part)],
        )
    for topic, part in sorted(found.unknown - trusted.keys()):
        log.warning(
            "%s[%d]: the delivered position is unknown (no sink-group offset, the control topic %r no "
            "longer holds its history, not in Spark's checkpoint); starting from source.starting-offsets "
            "%r, which may duplicate or skip records",
            topic,
            part,
            channel.control_topic,
            starting_offsets,
        )
    return {**found.delivered, **restore_positions(channel, trusted, "Spark's checkpoint")}


def restore_in_slices(
    channel: SinkChannel, producer: TransactionalProducer, group_metadata: bytes, slices: list[Slice]
) -> dict[TopicPartitionKey, int | None]:
    """The delivered positions of partitions whose sink-group offsets vanished while the app ran.

    Keeps I1 for a worker: the broker expires an offset ``offsets.retention.minutes`` after its last
    commit, for example when a broker outage outlasts it, and a batch replayed afterwards would
    otherwise be delivered again. The control topic proves the positions; they are restored into the
    group at once, in one transaction under the worker's producer that has just fenced older
    attempts (I3), so the next slices read them as usual. It reads the control topic's history once
    for all the partition group's silent partitions, so the worker calls it only when the sink group
    is silent about them: for partitions' first slices, and after an expiry.

    A position recorded under another topic id than the slice's ``topic_id`` (the topic now) is the
    old topic's of a recreated one and is never restored. The new topic's slice may go ahead only if
    it starts at the partition's log start (planning read it from its beginning); a slice planned
    from later on (Spark went on from the old topic's positions) would skip the records before it, so
    it stops with :class:`TopicRecreatedError`, and the restart's planning reads the topic from its
    beginning. A partition with nothing recorded was never delivered (``None``).
    """
    found, _complete = control_topic_positions(channel)
    restored: dict[TopicPartitionKey, int | None] = {}
    for planned in slices:
        topic, partition, topic_id = planned.topic, planned.partition, planned.topic_id
        key = (topic, partition)
        restored[key] = None
        recorded_id = found.recorded_id(topic)
        if recorded_id is not None and topic_id is not None and recorded_id != topic_id:
            if planned.start > log_start_offset(channel.clients, topic, partition):
                raise TopicRecreatedError(topic, recorded_id, topic_id, running=True)
            continue
        recovered = found.offsets.get(key)
        if recovered is None:
            continue
        restored[key] = recovered
        log.warning(
            "sink group %r had no offset for %s (expired while the sink ran?); restored the delivered "
            "position %d from the control topic %r before delivering the slice",
            channel.sink_group,
            planned.label,
            recovered,
            channel.control_topic,
            extra={"topic": topic, "partition": partition, "offset": recovered},
        )
    positions = {key: offset for key, offset in restored.items() if offset is not None}
    if positions:
        with producer.transaction():
            send_delivered(producer, group_metadata, positions)
    return restored


# -- where the coordinator resumes reading the control topic ---------------------------------------


def seek_to_low_watermark(reader: ControlReader) -> int:
    """Seek ``reader`` to the coordinator group's committed low watermark (or the beginning); returns it.

    Keeps I4: every event from the low watermark on may still be needed by a table, so if the log
    now starts later (retention, delete-records), this raises ``ControlTopicError`` instead of
    starting at the log start, unless the :class:`~fanout_sink.protocol.offset_metadata.RoundMark`
    committed with the low watermark proves that the deleted events held nothing a table needs
    (the last round left nothing pending and nothing was written after it: a sink stopped cleanly,
    then down longer than the topic's retention). Without a committed offset, the legacy
    coordinator group's is migrated (:mod:`legacy_names`), else the low watermark the newest
    ``CommitComplete`` of the topic's tail recorded (:func:`control_tail.read_tail`): the coordinator
    group's offset expired after a downtime longer than the broker's ``offsets.retention.minutes``.
    """
    channel = reader.channel
    committed, offset_metadata = reader.committed(channel.timeout_s)
    if committed is None:
        committed = legacy_low_watermark(channel)
    if committed is None:
        committed = read_tail(channel).low_watermark
        if committed is not None:
            log.warning(
                "coordinator group %r has no offset (expired after a long downtime?); resuming from the "
                "low watermark %d recorded by the last CommitComplete on %r",
                channel.coordinator_group,
                committed,
                channel.control_topic,
            )
    log_start, log_end = reader.watermarks(channel.timeout_s)
    mark = RoundMark.decode(offset_metadata)
    if (
        committed is not None
        and log_start > committed
        and mark is not None
        and mark.nothing_needed_below(committed, log_end)
    ):
        log.info(
            "control topic %r lost offsets %d..%d (retention while the sink was down): only the last "
            "round's own events, which no table needs (it left nothing pending, nothing came after it); "
            "reading from the log start %d",
            channel.control_topic,
            committed,
            log_start - 1,
            log_start,
        )
        return reader.seek(log_start)
    reader.check_still_there(committed, channel.timeout_s)
    return reader.seek(committed if committed is not None else 0)
