"""A start of the sink: its partition-group layout recorded, the previous layout's ids fenced, and no
attempt of an earlier start able to commit afterwards.

Keeps I3 across layouts. Zombie fencing is per transactional id: ``init_transactions`` on an id
fences that id's older holders and aborts their open transaction, nothing else. A new
partition-group count gives every partition group a new id
(:func:`~.channel.partition_group_transactional_id`), so nothing in Kafka stops a worker of the
previous layout (a lingering executor, a Spark task retry, an old app's batch whose cached producer
was fenced and which opens a new one under the same old id) from reading the same sink-group offset
as the new layout's worker of the same range: both would commit it (issue 47 item 1). Three steps
close that, in this order:

1. **The start records itself** (:func:`fence_other_layouts`, on the driver before the first batch):
   the layout and a new start id (:func:`new_start_id`) become the metadata of one offset of the
   layout group (:attr:`~.channel.SinkChannel.layout_group`), committed in a Kafka transaction under
   the layout transactional id, whose ``init_transactions`` fences a start recording at the same
   time; its stable read after that sees the last start's record.
2. **Then it fences** every id of the layouts recorded before (the record's, and those a start that
   stopped half-way left unfenced), and records that they are fenced.
3. **Every attempt checks after opening its producer** (:func:`check_still_recorded`: a worker's new
   producer, a position writer's): a stable read of the record must still name its start.

Why no attempt of an earlier start can commit a range the new start's workers deliver: a producer
opened (``init_transactions``) after step 2 fenced its id reads the record after step 1 and
refuses. A producer opened before is fenced by step 2, so it commits only before step 2 ends, and
the new start's workers open theirs after step 2 and read the sink group stably: they see that
commit and deliver only the rest (I1). Under the same count step 2 fences none of the earlier
start's ids: they are the new start's own, and its workers' ``init_transactions`` fence them as
within one start. The check needs no atomic compare with the commit: its producer's epoch is the
lease, and the fence ends it. The record is read stably because a transactional offset commit
becomes visible only when its marker lands, just after ``commit_transaction`` returns.

Where the previous layout comes from without a record (the first start with packing, or a record
expired after ``offsets.retention.minutes`` without a start): the sink group itself, whose offsets
name the transactional id that committed them (:class:`~.offset_metadata.DeliveredBy`, written by
``recovery.send_delivered``), or carry no name when a partition's own id committed them (sinks
before packing). An expired record also passes every check: nothing later was recorded.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import TopicPartition

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import StartSupersededError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel as names
from fanout_sink.protocol.channel import CONTROL_PARTITION, SinkChannel
from fanout_sink.protocol.offset_metadata import DeliveredBy, LayoutRecord
from fanout_sink.protocol.partition_groups import PartitionGroups

log = logging.getLogger(__name__)

FENCING_THREADS = 8
"""Ids initialised at once: each ``init_transactions`` is a round trip or two to the broker."""


def new_start_id() -> str:
    """A start's id: its UTC time (for the operator reading a refusal) and random bits (unique)."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def read_record(channel: SinkChannel, stable: bool = False) -> LayoutRecord | None:
    """The record of the last start, or None if none is (or it expired). ``stable``: wait for a
    start's record still being committed (what an attempt's check needs); the commands beside the
    app do not wait."""
    reader = GroupOffsets(channel.clients, channel.layout_group, stable=stable)
    try:
        found = reader.committed_with_metadata([(channel.control_topic, CONTROL_PARTITION)])
    finally:
        reader.close()
    offset, offset_metadata = found[(channel.control_topic, CONTROL_PARTITION)]
    return LayoutRecord.decode(offset_metadata) if offset is not None else None


def channel_in_use(config: SinkConfig) -> SinkChannel:
    """The sink's channel under the layout its app recorded at its last start: what the commands
    beside the app (``status``, maintenance, ``import-connect``) use, so they name the transactional
    ids the app's workers use, and count as that start's. No record (a sink never started with
    packing, or one whose record expired): one group per partition, under the partitions' own ids."""
    unpacked = SinkChannel.from_config(config, PartitionGroups())
    record = read_record(unpacked)
    if record is None:
        return unpacked
    return dataclasses.replace(unpacked, partition_groups=record.layout, start_id=record.start)


def check_still_recorded(channel: SinkChannel) -> None:
    """Raise :class:`StartSupersededError` if a start after ``channel``'s recorded its layout. Call
    it after opening a producer that can commit sink-group offsets, before reading them: see the
    module docstring for why that order is enough."""
    if channel.start_id is None:
        return
    record = read_record(channel, stable=True)
    if record is None or record.start == channel.start_id:
        return
    raise StartSupersededError(
        f"sink {channel.sink!r} was started again (start {record.start}, "
        f"{record.layout.describe()}) after this app's start {channel.start_id}: the newer start "
        "delivers its ranges, so this attempt does not. This app stops; stop it for good if the newer "
        "one is meant to run (one app per sink)."
    )


def _write_record(channel: SinkChannel, producer: TransactionalProducer, record: LayoutRecord) -> None:
    """Commit ``record`` as the layout group's one offset, in a transaction of ``producer`` (the
    layout transactional id's): the layout group has no members."""
    mark = TopicPartition(channel.control_topic, CONTROL_PARTITION, 0, metadata=record.encode())
    with producer.transaction():
        producer.send_offsets([mark], channel.clients.group_metadata(channel.layout_group))


def _layout_ids(channel: SinkChannel, layout: PartitionGroups, partitions: list[tuple[str, int]]) -> set[str]:
    """Every transactional id ``layout`` could have delivered ``partitions`` under."""
    if layout.count is None:
        return {names.worker_transactional_id(channel.sink, t, p) for t, p in partitions}
    return {
        names.partition_group_transactional_id(channel.sink, layout.count, i) for i in range(layout.count)
    }


def _committed_layouts(channel: SinkChannel, partitions: list[tuple[str, int]]) -> set[PartitionGroups]:
    """The layouts of the ids that committed the sink group's offsets (one group per partition where
    none is named)."""
    reader = GroupOffsets(channel.clients, channel.sink_group, stable=False)
    try:
        found = reader.committed_with_metadata(partitions)
    finally:
        reader.close()
    layouts: set[PartitionGroups] = set()
    for offset, offset_metadata in found.values():
        if offset is not None:
            delivered_by = DeliveredBy.decode(offset_metadata)
            name = delivered_by.transactional_id if delivered_by is not None else ""
            layouts.add(names.partition_groups_of(channel.sink, name))
    return layouts


def _fence(channel: SinkChannel, transactional_id: str) -> None:
    producer = TransactionalProducer(
        channel.clients,
        transactional_id,
        fenced_message=f"fencing {transactional_id!r} of an earlier partition-group layout was itself fenced",
    )
    producer.flush()


def _fence_all(channel: SinkChannel, stale: Iterable[str]) -> None:
    with ThreadPoolExecutor(FENCING_THREADS, thread_name_prefix="fanout-sink-fence") as pool:
        list(pool.map(lambda name: _fence(channel, name), sorted(stale)))


def fence_other_layouts(channel: SinkChannel, partitions: list[tuple[str, int]]) -> int:
    """Record ``channel``'s start and layout, then fence every transactional id of the layouts
    recorded before that ``channel.partition_groups`` does not use; returns how many ids were
    fenced. Run by the driver before the first batch (and before planning restores positions under
    the new ids); see the module docstring for the order."""
    producer = TransactionalProducer(
        channel.clients,
        channel.layout_transactional_id,
        fenced_message=(
            f"another start of sink {channel.sink!r} recorded its partition-group layout at the same "
            "time; this start stops (one app per sink)"
        ),
    )
    try:
        recorded = read_record(channel, stable=True)
        if recorded is not None:
            earlier = {recorded.layout, *recorded.unfenced}
            source = f"the recorded layout ({recorded.layout.describe()})"
        else:
            earlier = _committed_layouts(channel, partitions)
            source = "the transactional ids that committed the sink group's offsets"
        earlier.discard(channel.partition_groups)
        unfenced = tuple(sorted(earlier, key=lambda layout: layout.count or 0))
        _write_record(channel, producer, LayoutRecord(channel.partition_groups, channel.start_id, unfenced))
        fault_point("layout.recorded", start=channel.start_id)
        stale: set[str] = set()
        for layout in unfenced:
            stale |= _layout_ids(channel, layout, partitions)
        stale -= _layout_ids(channel, channel.partition_groups, partitions)
        if stale:
            log.info(
                "partition-group layout changed to %s: fencing %d transactional id(s) of %s before the "
                "first batch, so none of their producers can still commit",
                channel.partition_groups.describe(),
                len(stale),
                source,
            )
            _fence_all(channel, stale)
        if unfenced:
            _write_record(channel, producer, LayoutRecord(channel.partition_groups, channel.start_id))
        # A stable read returns once the commit's markers landed: from then on the commands beside
        # the app, which read without waiting, see this record too.
        read_record(channel, stable=True)
        return len(stale)
    finally:
        if producer.usable:  # a fenced one has nothing to deliver, and its flush raises the fence again
            producer.flush()
