"""Migration from the names before ':' joined their parts (delete this module once no deployment
runs on them).

The sink group and the coordinator group used to be ``fanout-sink-<sink>`` and
``fanout-sink-<sink>-coordinator``: joined with '-', which sink and topic names may contain, so sink
``a`` reading ``b-c`` and sink ``a-b`` reading ``c`` fenced each other. The legacy groups are only
ever read, once, when the new group has no offset yet, so that an existing deployment resumes
where it was; recovery writes what it finds under the new names.
"""

from __future__ import annotations

import logging

from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol.channel import CONTROL_PARTITION, SinkChannel

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]


def legacy_sink_group(sink: str) -> str:
    """The sink group's name before names were joined with ':' (read only, to migrate its offsets)."""
    return f"fanout-sink-{sink}"


def legacy_coordinator_group(sink: str) -> str:
    """The coordinator group's name before names were joined with ':' (read only, to migrate)."""
    return f"fanout-sink-{sink}-coordinator"


def legacy_sink_positions(
    channel: SinkChannel, partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """The offsets the legacy sink group holds for ``partitions`` (the ones it has none for left out).

    Keeps I1 across the rename: each is a position a committed transaction of the old version
    delivered, so recovery may restore it under the new name.
    """
    legacy = GroupOffsets(channel.clients, legacy_sink_group(channel.sink), stable=False)
    try:
        return {k: v for k, v in legacy.committed(partitions).items() if v is not None}
    finally:
        legacy.close()


def legacy_low_watermark(channel: SinkChannel) -> int | None:
    """The low watermark under the coordinator group's legacy name, for a deployment that ran before
    the rename (its new group has no offset yet); None when there is none.

    Keeps I4 across the rename: the coordinator resumes where the old one acknowledged, never above
    a table's pending files.
    """
    legacy = GroupOffsets(channel.clients, legacy_coordinator_group(channel.sink), stable=False)
    key = (channel.control_topic, CONTROL_PARTITION)
    try:
        found = legacy.committed([key])[key]
    finally:
        legacy.close()
    if found is not None:
        log.info(
            "coordinator group %r has no offset yet; migrated the low watermark %d of the legacy group %r",
            channel.coordinator_group,
            found,
            legacy_coordinator_group(channel.sink),
        )
    return found
