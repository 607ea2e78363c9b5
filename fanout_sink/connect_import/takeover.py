"""The online half of moving over from the Iceberg Kafka Connect sink: a takeover that starts each
source partition exactly where the connector's tables end.

The takeover (:func:`take_over`) is exact because of how the Java sink commits. Its worker sends the
``DataWritten`` and ``DataComplete`` events to the connector's control topic and the SOURCE offsets
to one consumer group in one Kafka transaction: Connect's group (``connect-<name>``) for Apache's
sink; Tabular's commits them to its control group (``cg-control-<name>``) in that transaction and to
Connect's group in a second one, so after a crash between the two Connect's group lags by a commit,
and its control group is what Tabular itself restarts from (``Imported.commit_group``). Its
coordinator appends the files to the tables later and records the CONTROL-topic offsets it had read
in each snapshot's summary (``kafka.connect.offsets.<control-topic>.<that group>``). So that group's
offsets are where the tables end exactly when every data file announced on the control topic reached
its table: a ``DataWritten`` of table T at offset X of control partition P is in T when T's newest
such summary holds an offset above X for P. The takeover refuses while the connector runs (members
in its groups), when the group has no offsets, when an announced file has not reached its table (a
commit in flight, or one the connector never finished), when an announced table is not in the
catalog, and when a control record framed as an event does not decode; otherwise it writes those
offsets into the sink-managed group the way a worker does, and the sink's first start reads from
there (``protocol/recovery.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition
from pyiceberg.exceptions import NoSuchTableError

from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.connect_import.events import UndecodableEvent, announced_table, recorded_control_offset
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


def _announcements(imported: Imported, clients: Any) -> dict[tuple[str, int], int]:
    """Each (table, control partition) the connector announced data files for, with the offset of
    its newest such ``DataWritten`` on that partition: every partition is read, each is checked on
    its own (a table's summary records an offset per control partition)."""
    control = imported.control_topic
    consumer = clients.consumer(
        {
            "group.id": f"{imported.sink['name']}-takeover-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    announced: dict[tuple[str, int], int] = {}
    try:
        metadata = consumer.list_topics(control, timeout=clients.timeout_s)
        topic = metadata.topics.get(control)
        if topic is None or topic.error is not None:
            raise ImportError_(
                f"iceberg.control.topic: {control!r} does not exist on the broker; the "
                "connector never ran, or this is not its config"
            )
        for partition in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(control, partition), timeout=clients.timeout_s
            )
            if high <= low:
                continue
            consumer.assign([TopicPartition(control, partition, low)])
            position = low
            while position < high:
                message = consumer.poll(clients.timeout_s)
                if message is None:
                    break  # read_committed: the last stable offset can stay below high (markers)
                if message.error() is not None:
                    raise ImportError_(
                        f"iceberg.control.topic: reading {control!r} failed: {message.error()}"
                    )
                position = message.offset() + 1
                try:
                    table = announced_table(message.value(), imported.commit_group)
                except UndecodableEvent as exc:
                    raise ImportError_(
                        f"iceberg.control.topic: the record at {control}[{partition}]@{message.offset()} "
                        f"is framed as an Iceberg Kafka Connect event but does not decode ({exc}): check "
                        "that iceberg.control.topic is the connector's control topic and nothing else "
                        "writes to it; nothing written"
                    ) from None
                if table is not None:
                    announced[(table, partition)] = message.offset()
    finally:
        consumer.close()
    return announced


def _uncommitted_files(imported: Imported, config: SinkConfig, clients: Any) -> list[str]:
    """Each table whose data files the connector announced but did not commit, with the control
    offset of the newest such announcement per control partition (empty: every announced file is
    in its table)."""
    announced = _announcements(imported, clients)
    catalog = load_catalog(config.catalog, create=False)
    tables: dict[str, Any] = {}
    problems = []
    for (name, partition), offset in sorted(announced.items()):
        where = f"{imported.control_topic}[{partition}]@{offset}"
        if name not in tables:
            try:
                tables[name] = catalog.load_table(name)
            except NoSuchTableError:
                raise ImportError_(
                    f"iceberg.tables: {name}, announced at {where}, is not in the catalog "
                    f"{config.catalog.name!r}: check that catalog: is the connector's (iceberg.catalog.*); "
                    "a table dropped since cannot show where the connector ended, so seed the sink group "
                    "by hand or run without --take-over"
                ) from None
        committed = recorded_control_offset(
            tables[name], imported.control_topic, imported.commit_group, partition
        )
        if committed is None or committed <= offset:
            problems.append(
                f"{name}: data files announced at {where}, the table's commits recorded up to {committed}"
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
    reader = GroupOffsets(clients, imported.commit_group, stable=True)  # waits for pending transactions
    try:
        found = {key: value for key, value in reader.committed(wanted).items() if value is not None}
    finally:
        reader.close()
    if not found:
        raise ImportError_(
            f"name: the connector's group {imported.commit_group!r} has no offsets for "
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
