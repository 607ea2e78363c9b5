"""The online half of moving over from the Iceberg Kafka Connect sink: a takeover that starts each
source partition exactly where the connector's tables end.

The takeover (:func:`take_over`) is exact because of how the Java sink commits. Its worker sends the
``DataWritten`` and ``DataComplete`` events to the connector's control topic and the SOURCE offsets
to Connect's consumer group (``connect-<name>``) in one Kafka transaction; its coordinator appends
the files to the tables later and records the CONTROL-topic offsets it had read in each snapshot's
summary (``kafka.connect.offsets.<control-topic>.<group>``). So the Connect group's offsets are
where the tables end exactly when every data file announced on the control topic reached its table:
a ``DataWritten`` of table T at control offset X is in T when T's newest such summary holds an offset
above X. The takeover refuses while the connector runs (members in its groups), when the group has
no offsets, and when an announced file has not reached its table (a commit in flight, or one the
connector never finished); otherwise it writes those offsets into the sink-managed group the way a
worker does, and the sink's first start reads from there (``protocol/recovery.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.connect_import.events import announced_table, recorded_control_offset
from fanout_sink.connect_import.translator import Imported, ImportError_
from fanout_sink.kafka.clients import retry_transient
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol.group_layout import channel_in_use
from fanout_sink.protocol.recovery import PositionWriter, delivered_offsets
from fanout_sink.spark.planning import source_partitions


@dataclass(frozen=True)
class Takeover:
    """What the takeover wrote: each source partition's start, and the partitions left to
    ``source.starting-offsets`` (the connector delivered nothing from them)."""

    positions: dict[tuple[str, int], int]
    unstarted: list[tuple[str, int]]


def _groups_with_members(admin: Any, groups: list[str], timeout_s: float) -> dict[str, int]:
    """The groups that have members now: the connector (or a task of it) still runs. A group the
    broker never saw is empty; its coordinator may answer NOT_COORDINATOR while loading (retried)."""

    def members(group: str) -> int:
        description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result()
        return len(description.members)

    found = {group: retry_transient(functools.partial(members, group), timeout_s) for group in groups}
    return {group: count for group, count in found.items() if count}


def _uncommitted_files(imported: Imported, config: SinkConfig, clients: Any) -> list[str]:
    """Each table whose data files the connector announced but did not commit, with the control
    offset of the newest such announcement (empty: every announced file is in its table)."""
    consumer = clients.consumer(
        {
            "group.id": f"{config.name}-takeover-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    announced: dict[str, tuple[int, int]] = {}  # table -> (partition, offset) of its newest DataWritten
    try:
        metadata = consumer.list_topics(imported.control_topic, timeout=clients.timeout_s)
        topic = metadata.topics.get(imported.control_topic)
        if topic is None or topic.error is not None:
            raise ImportError_(
                f"iceberg.control.topic: {imported.control_topic!r} does not exist on the broker; the "
                "connector never ran, or this is not its config"
            )
        for partition in topic.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(imported.control_topic, partition), timeout=clients.timeout_s
            )
            if high <= low:
                continue
            consumer.assign([TopicPartition(imported.control_topic, partition, low)])
            position = low
            while position < high:
                message = consumer.poll(clients.timeout_s)
                if message is None:
                    break  # read_committed: the last stable offset can stay below high (markers)
                if message.error() is not None:
                    raise ImportError_(
                        f"iceberg.control.topic: reading {imported.control_topic!r} failed: {message.error()}"
                    )
                position = message.offset() + 1
                table = announced_table(message.value(), imported.connect_group)
                if table is None:
                    continue
                announced[table] = max(announced.get(table, (partition, -1)), (partition, message.offset()))
    finally:
        consumer.close()
    catalog = load_catalog(config.catalog, create=False)
    problems = []
    for table, (partition, offset) in sorted(announced.items()):
        committed = recorded_control_offset(
            catalog.load_table(table),
            imported.control_topic,
            (imported.connect_group, imported.control_group),
            partition,
        )
        if committed is None or committed <= offset:
            problems.append(
                f"{table}: data files announced at {imported.control_topic}[{partition}]@{offset}, the "
                f"table's commits recorded up to {committed}"
            )
    return problems


def take_over(imported: Imported, config: SinkConfig) -> Takeover:
    """Seed the sink group with the connector's source offsets, once the connector is stopped and its
    last commit completed; raises :class:`ImportError_` saying what to do otherwise."""
    channel = channel_in_use(config)
    clients = channel.clients
    running = _groups_with_members(
        clients.admin(), [imported.connect_group, imported.control_group], clients.timeout_s
    )
    if running:
        raise ImportError_(
            f"name: the connector {imported.connector!r} still runs ({running} members): stop it first "
            f"(`curl -X DELETE <connect>/connectors/{imported.connector}`, or stop Connect standalone), "
            "then run --take-over again"
        )
    partitions = source_partitions(config, channel)
    wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
    reader = GroupOffsets(clients, imported.connect_group, stable=True)  # waits for pending transactions
    try:
        found = {key: value for key, value in reader.committed(wanted).items() if value is not None}
    finally:
        reader.close()
    if not found:
        raise ImportError_(
            f"name: the connector's group {imported.connect_group!r} has no offsets for "
            f"{sorted(partitions)}: "
            "nothing to take over from; run the sink without --take-over (source.starting-offsets decides)"
        )
    ours = delivered_offsets(channel, wanted)
    if ours:
        raise ImportError_(
            f"name: the sink group {channel.sink_group!r} already holds offsets ({len(ours)} partitions): "
            "this sink has run; a takeover is only for its first start"
        )
    problems = _uncommitted_files(imported, config, clients)
    if problems:
        raise ImportError_(
            "iceberg.control.topic: the connector's last commit did not complete, so its group's offsets are "
            "ahead of its tables: " + "; ".join(problems) + ". Start the connector again until it logs a "
            "completed commit, stop it, and run --take-over again"
        )
    writer = PositionWriter(channel)
    try:
        for (topic, part), offset in sorted(found.items()):
            held = writer.commit(topic, part, offset, expected=None)
            if held is not None and held != offset:
                raise ImportError_(
                    f"name: the sink group got offset {held} for {topic}[{part}] meanwhile: "
                    "is the sink running?"
                )
    finally:
        writer.close()
    return Takeover(found, [key for key in wanted if key not in found])
