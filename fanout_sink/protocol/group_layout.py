"""A start under another partition-group layout: the old layout's transactional ids fenced first.

Keeps I3 across layouts. Zombie fencing is per transactional id: ``init_transactions`` on an id
fences that id's older holders and aborts their open transaction, nothing else. A new group count
gives every group a new id (:func:`~.channel.group_transactional_id`), so a worker of the previous
layout that is still alive (a lingering executor of a crashed driver) would not be fenced by the new
one and could commit a range the new layout delivers again; an old id's open transaction would also
hold ``read_committed`` readers of the control topic until it times out. So before the first batch
the driver initialises every id the previous layout could have used, then records the new layout.

Where the previous layout comes from:

- the layout record (:class:`~.offset_metadata.LayoutRecord`): the metadata of one offset the driver
  commits under the sink's layout group (:attr:`~.channel.SinkChannel.layout_group`) once the old
  ids are fenced, so a layout is recorded before any of its workers runs (the commands beside the
  app read it too: :func:`channel_in_use`);
- without a record (the first start with packing, or a record expired after
  ``offsets.retention.minutes`` without a restart): the sink group itself, whose offsets name the
  transactional id that committed them (:class:`~.offset_metadata.DeliveredBy`, written by
  ``recovery.send_delivered``), or carry no name when a partition's own id committed them (sinks
  before packing).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import TopicPartition

from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel as names
from fanout_sink.protocol.channel import CONTROL_PARTITION, SinkChannel
from fanout_sink.protocol.offset_metadata import DeliveredBy, LayoutRecord
from fanout_sink.protocol.partition_groups import PartitionGroups

log = logging.getLogger(__name__)

FENCING_THREADS = 8
"""Ids initialised at once: each ``init_transactions`` is a round trip or two to the broker."""


def read_record(channel: SinkChannel) -> PartitionGroups | None:
    """The layout recorded by the last start, or None if none is (or it expired)."""
    reader = GroupOffsets(channel.clients, channel.layout_group, stable=False)
    try:
        found = reader.committed_with_metadata([(channel.control_topic, CONTROL_PARTITION)])
    finally:
        reader.close()
    offset, offset_metadata = found[(channel.control_topic, CONTROL_PARTITION)]
    record = LayoutRecord.decode(offset_metadata) if offset is not None else None
    return record.layout if record is not None else None


def channel_in_use(config: SinkConfig) -> SinkChannel:
    """The sink's channel under the layout its app recorded at its last start: what the commands
    beside the app (``status``, maintenance, ``import-connect``) use, so they name the transactional
    ids the app's workers use. No record (a sink never started with packing, or one whose record
    expired): one group per partition, under the partitions' own ids."""
    unpacked = SinkChannel.from_config(config, PartitionGroups())
    return dataclasses.replace(unpacked, groups=read_record(unpacked) or PartitionGroups())


def _write_record(channel: SinkChannel) -> None:
    """Record ``channel.groups`` as the layout in use (a plain commit: the layout group has no members)."""
    consumer = channel.clients.consumer({"group.id": channel.layout_group, "enable.auto.commit": False})
    try:
        record = LayoutRecord(channel.groups).encode()
        mark = TopicPartition(channel.control_topic, CONTROL_PARTITION, 0, metadata=record)
        consumer.commit(offsets=[mark], asynchronous=False)
    finally:
        consumer.close()


def _layout_ids(channel: SinkChannel, layout: PartitionGroups, partitions: list[tuple[str, int]]) -> set[str]:
    """Every transactional id ``layout`` could have delivered ``partitions`` under."""
    if layout.count is None:
        return {names.worker_transactional_id(channel.sink, t, p) for t, p in partitions}
    return {names.group_transactional_id(channel.sink, layout.count, i) for i in range(layout.count)}


def _committed_ids(channel: SinkChannel, partitions: list[tuple[str, int]]) -> set[str]:
    """The ids that committed the sink group's offsets (a partition's own id where none is named)."""
    reader = GroupOffsets(channel.clients, channel.sink_group, stable=False)
    try:
        found = reader.committed_with_metadata(partitions)
    finally:
        reader.close()
    ids: set[str] = set()
    for (topic, partition), (offset, offset_metadata) in found.items():
        if offset is None:
            continue
        delivered_by = DeliveredBy.decode(offset_metadata)
        own = names.worker_transactional_id(channel.sink, topic, partition)
        ids.add(delivered_by.transactional_id if delivered_by is not None else own)
    return ids


def _fence(channel: SinkChannel, transactional_id: str) -> None:
    producer = TransactionalProducer(
        channel.clients,
        transactional_id,
        fenced_message=f"fencing {transactional_id!r} of an earlier partition-group layout was itself fenced",
    )
    producer.flush()


def fence_other_layouts(channel: SinkChannel, partitions: list[tuple[str, int]]) -> int:
    """Fence every transactional id of the previous layout that ``channel.groups`` does not use, then
    record ``channel.groups``; returns how many ids were fenced. Run by the driver before the first
    batch (and before planning restores positions under the new ids)."""
    recorded = read_record(channel)
    if recorded == channel.groups:
        return 0
    if recorded is not None:
        stale = _layout_ids(channel, recorded, partitions)
        source = f"the recorded layout ({recorded.describe()})"
    else:
        stale = _committed_ids(channel, partitions)
        source = "the transactional ids that committed the sink group's offsets"
    stale -= _layout_ids(channel, channel.groups, partitions)
    if stale:
        log.info(
            "partition-group layout changed to %s: fencing %d transactional id(s) of %s before the "
            "first batch, so none of their producers can still commit",
            channel.groups.describe(),
            len(stale),
            source,
        )
        with ThreadPoolExecutor(FENCING_THREADS, thread_name_prefix="fanout-sink-fence") as pool:
            list(pool.map(lambda name: _fence(channel, name), sorted(stale)))
    _write_record(channel)
    return len(stale)
