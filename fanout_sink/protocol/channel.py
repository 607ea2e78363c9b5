"""The control topic: where workers publish what they wrote and the coordinator reads it back.

Everything here exists to keep two promises. Events reach the coordinator only when their Kafka
transaction committed (``read_committed``, so an aborted attempt's files are never appended), and
events keep one total order (one partition), so "control offset" means the same thing to every
process and each table can record how far it has consumed.

Names derived from the sink name, in one place because every part must agree on them. Parts are
joined with ':', which neither a sink name (``^[A-Za-z0-9][A-Za-z0-9._-]*$``) nor a Kafka topic name
(``[A-Za-z0-9._-]``) can contain, so distinct (sink, topic, partition) always give distinct names:

- ``fanout-sink:<sink>``: the sink-managed consumer group holding the source offsets. Nobody ever
  joins it; offsets arrive only through ``send_offsets_to_transaction`` with generation -1.
- ``fanout-sink:<sink>:coordinator``: the coordinator's group, holding its control-topic low watermark.
- ``fanout-sink:<sink>:layout``: the layout group, whose one offset records the partition-group count
  in use and the start that recorded it (:mod:`.group_layout`); also the transactional id of the
  starts that write that record, so two starts at once cannot both record theirs unseen.
- ``fanout-sink:<sink>:groups:<count>:<index>``: a worker's transactional id, one per partition group
  of a layout of ``count`` (stable while the count stays; a new count never reuses one).
- ``fanout-sink:<sink>:<topic>:<partition>``: a partition's own transactional id, for deliveries
  without packing (tools and tests deliver partitions one at a time) and sinks from before packing.
- ``fanout-sink:<sink>:coordinator``: the coordinator's transactional id (stable per sink).

Before, the parts were joined with '-' (sink ``a`` reading ``b-c`` and sink ``a-b`` reading ``c``
fenced each other). The legacy group names are still read once, when the new group has no offset
yet, so that an existing deployment resumes where it was (``protocol/legacy_names.py``).

This module only reads and writes the topic: where the coordinator starts reading it, and what
a partition's delivered position is, are decided in ``protocol/recovery.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fanout_sink.config.models import SinkConfig
from fanout_sink.config.topics import ControlSettings
from fanout_sink.errors import ControlTopicError, TopicError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.clients import DEFAULT_TIMEOUT_S, KafkaClientFactory, KafkaConf, retry_transient
from fanout_sink.kafka.topics import TopicSettings, ensure_topic
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.partition_groups import PartitionGroups

log = logging.getLogger(__name__)

CONTROL_PARTITION = 0

CONTROL_SCAN_TIMEOUT_S = 600.0
"""How long one bounded read of the control topic may take: a window of its tail at start
(:mod:`.control_tail`), never its whole retained history."""


SEPARATOR = ":"
"""Joins the parts of every name: sink names and topic names cannot contain it."""


def _name(*parts: object) -> str:
    return SEPARATOR.join(["fanout-sink", *(str(p) for p in parts)])


def sink_group(sink: str) -> str:
    """The sink-managed group: source offsets delivered to the tables (source of truth, invariant I1)."""
    return _name(sink)


def coordinator_group(sink: str) -> str:
    """The coordinator's own group: control offsets every table has passed (the low watermark)."""
    return _name(sink, "coordinator")


def worker_transactional_id(sink: str, topic: str, partition: int) -> str:
    """A partition's own transactional id (no packing: :class:`PartitionGroups` without a count)."""
    return _name(sink, topic, partition)


def partition_group_transactional_id(sink: str, count: int, index: int) -> str:
    """Partition group ``index`` of a layout of ``count``: another count never reuses an id, so an old
    layout's producers are fenced explicitly (:mod:`.group_layout`), not by chance."""
    return _name(sink, "groups", count, index)


def partition_groups_of(sink: str, transactional_id: str) -> PartitionGroups:
    """The layout a worker transactional id of ``sink`` belongs to: a partition group's names its
    count; any other is a partition's own (one group per partition)."""
    head, _, index = transactional_id.rpartition(SEPARATOR)
    prefix = _name(sink, "groups") + SEPARATOR
    count = head[len(prefix) :] if head.startswith(prefix) else ""
    # ``<sink>:groups:<partition>`` is the own id of a topic named "groups": one part after the prefix.
    if count.isdigit() and index.isdigit():
        return PartitionGroups(int(count))
    return PartitionGroups()


def layout_group(sink: str) -> str:
    """The group whose one committed offset's metadata records the partition-group layout in use
    (and the transactional id of the starts that commit it)."""
    return _name(sink, "layout")


def coordinator_transactional_id(sink: str) -> str:
    return _name(sink, "coordinator")


@dataclass(frozen=True)
class SinkChannel:
    """One sink's identity on Kafka: its name, Kafka settings, control topic and timeouts.

    Everything that talks to Kafka for a sink (workers, the coordinator, the control reader,
    recovery, ``status``, orphan cleanup) takes this one value, so the names derived from the sink
    name and the clients made from its settings cannot disagree between them. Plain data: it
    travels to Spark executors as it is.
    """

    sink: str
    kafka: KafkaConf
    control_topic: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    """How long one Kafka call may wait."""
    scan_timeout_s: float = CONTROL_SCAN_TIMEOUT_S
    """How long one read of a window of the control topic's tail may take."""
    partition_groups: PartitionGroups = field(default_factory=PartitionGroups)
    """How source partitions share transactional ids (not a Kafka group: those are the ``*_group``
    names): the layout the app decided at start and recorded (:mod:`.group_layout`), which every
    process of the sink uses."""
    start_id: str | None = None
    """The app start this channel delivers for (:func:`.group_layout.new_start_id`), recorded with
    its layout: a worker's new producer, or a position writer's, checks that no later start recorded
    another (:func:`.group_layout.check_still_recorded`), so an attempt of a superseded start cannot
    commit. None: a channel no start made (tests and tools delivering alone), never checked."""

    @classmethod
    def from_config(
        cls, config: SinkConfig, partition_groups: PartitionGroups, start_id: str | None = None
    ) -> SinkChannel:
        """The sink's channel under the layout ``partition_groups``: the app's decision
        (``spark/partition_group_count.py``), or the one it recorded (:func:`.group_layout.channel_in_use`).
        The config does not say it, so every caller names where its layout comes from."""
        return cls(
            sink=config.name,
            kafka=dict(config.kafka),
            control_topic=config.control_topic,
            partition_groups=partition_groups,
            start_id=start_id,
        )

    @property
    def clients(self) -> KafkaClientFactory:
        """The factory of every Kafka client of this sink, bound to its settings and timeout."""
        return KafkaClientFactory(self.kafka, self.timeout_s)

    @property
    def sink_group(self) -> str:
        return sink_group(self.sink)

    @property
    def coordinator_group(self) -> str:
        return coordinator_group(self.sink)

    @property
    def coordinator_transactional_id(self) -> str:
        return coordinator_transactional_id(self.sink)

    @property
    def layout_group(self) -> str:
        return layout_group(self.sink)

    @property
    def layout_transactional_id(self) -> str:
        """The id under which starts record their layout: one start at a time, each fencing the last."""
        return layout_group(self.sink)

    def worker_transactional_id(self, topic: str, partition: int) -> str:
        """The transactional id that delivers ``topic[partition]``: its group's under packing."""
        count = self.partition_groups.count
        if count is None:
            return worker_transactional_id(self.sink, topic, partition)
        return partition_group_transactional_id(
            self.sink, count, self.partition_groups.group_of(topic, partition)
        )


def ensure_control_topic(channel: SinkChannel, *, settings: TopicSettings | None = None) -> None:
    """Create the control topic (one partition, ``control.retention-ms``, as durable as the source
    offsets), or check the existing one.

    ``settings`` come from the YAML ``control:`` section; the app passes them at start and an
    existing topic is then checked in full: exactly one partition, replication, no compaction, and
    a warning for a retention shorter than configured. Workers and the coordinator pass none: they create the
    topic with the defaults if it is missing, and check only its partition count.
    """
    check = settings is not None
    topic = channel.control_topic
    state = ensure_topic(
        channel.clients, topic, "control topic", settings or ControlSettings().topic_settings(), check
    )
    if state.partitions != 1:
        raise TopicError(
            f"control topic {topic!r} has {state.partitions} partitions; the sink needs exactly 1 so that "
            "control offsets are one total order.\n"
            "  fix: point control.topic at a new name (the sink creates it), or recreate this topic "
            "with 1 partition."
        )
    if settings is not None and not state.created:
        _check_retention(topic, settings, state.config)


def _check_retention(topic: str, settings: TopicSettings, actual: Mapping[str, str]) -> None:
    """Compaction would delete events in the middle of the log, which no offset check can notice:
    refused. Retention deletes from the start, and a restart needs only the tail (the events a table
    still needs, and the newest round): a topic that keeps every event works as before and is told
    how to bound it; one that keeps less than configured is warned about, since a table failing or
    a crashed sink staying down longer than that stops the sink with ``ControlTopicError``."""
    if "compact" in actual.get("cleanup.policy", ""):
        raise TopicError(
            f"control topic {topic!r} has cleanup.policy={actual['cleanup.policy']}: compaction keeps only "
            "the last event per key (the sink name), so events of tables not yet committed would vanish.\n"
            f"  fix: kafka-configs --alter --entity-type topics --entity-name {topic} "
            "--add-config cleanup.policy=delete"
        )
    for key in ("retention.ms", "retention.bytes"):
        value, wanted = int(actual.get(key, "-1")), int(settings.config.get(key, "-1"))
        if value == -1 and wanted != -1:
            log.info(
                "control topic %r keeps every event (%s=-1) and grows with every round; a restart reads "
                "only its tail, so it can be bounded like new control topics: kafka-configs --alter "
                "--entity-type topics --entity-name %s --add-config %s=%d",
                topic,
                key,
                topic,
                key,
                wanted,
            )
        elif value != -1 and (wanted == -1 or value < wanted):
            log.warning(
                "control topic %r has %s=%d, less than configured (control.%s=%d). A table failing for "
                "longer than that, or a sink that crashed with events pending and stays down that long, "
                "then stops with ControlTopicError instead of skipping them. fix: kafka-configs --alter "
                "--entity-type topics --entity-name %s --add-config %s=%d",
                topic,
                key,
                value,
                key.replace(".", "-"),
                wanted,
                topic,
                key,
                wanted,
            )


EVENT_FRAMING_BYTES = 512
"""What a Kafka record batch adds around one event besides its key: batch and record headers."""


def event_budget(sink: str, max_message_bytes: int) -> int:
    """The most bytes one encoded event of ``sink`` may take on a control topic whose messages may
    be ``max_message_bytes`` long (``kafka.topics.max_message_bytes``): the rest is the key (the sink
    name) and the record batch's framing. A larger event fails its transaction on every retry."""
    return max_message_bytes - EVENT_FRAMING_BYTES - len(sink.encode())


def produce_event(producer: TransactionalProducer, topic: str, sink: str, payload: ev.Payload) -> None:
    """Queue one event; keyed by sink name so other sinks' readers can skip it without decoding."""
    producer.produce(topic, ev.encode(ev.Event(sink=sink, payload=payload)), key=sink.encode())


@dataclass(frozen=True)
class ControlEvent:
    """An event with the control offset it was read at (what tables record as consumed)."""

    offset: int
    event: ev.Event


class ControlReader:
    """A ``read_committed`` consumer of the control topic, assigned (never subscribed) to partition 0.

    Assigning rather than subscribing keeps the coordinator out of any group membership: its
    progress is committed as offsets only, so two coordinators never rebalance each other.
    """

    def __init__(self, channel: SinkChannel) -> None:
        self.channel = channel
        self.sink = channel.sink
        self.topic = channel.control_topic
        self._key = channel.sink.encode()
        self._tp = TopicPartition(self.topic, CONTROL_PARTITION)
        self._consumer = channel.clients.consumer(
            {
                "group.id": channel.coordinator_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # Never jump over deleted events: a position below the log start is an error
                # (ERR__AUTO_OFFSET_RESET on poll), reported as ControlTopicError.
                "auto.offset.reset": "error",
            }
        )
        self._position = 0

    def committed(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int | None, str | None]:
        """The coordinator group's committed low watermark and the offset metadata committed with it
        (the round's ``offset_metadata.RoundMark``); (None, None) when it has none (where to start
        reading then is recovery's decision: ``recovery.seek_to_low_watermark``)."""
        found = retry_transient(lambda: self._consumer.committed([self._tp], timeout=timeout_s))[0]
        return (int(found.offset), found.metadata) if found.offset >= 0 else (None, None)

    def check_still_there(self, needed_from: int | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Raise unless the log still holds every offset from ``needed_from`` (None: from 0) on."""
        low, high = self.watermarks(timeout_s)
        if low > (needed_from or 0):
            raise ControlTopicError(self.topic, self.channel.coordinator_group, needed_from, low)
        if needed_from is not None and needed_from > high:
            raise TopicError(
                f"control topic {self.topic!r} [0] ends at offset {high}, below offset {needed_from} that "
                f"coordinator group {self.channel.coordinator_group!r} has acknowledged: the topic was "
                "deleted and recreated. The tables record control offsets of the old topic, so events of "
                "the new one below them would be taken for committed ones.\n"
                "  fix: restore the original control topic; a sink cannot move to a new control topic under "
                "the same name (start a new sink name, with new tables or after checking them)"
            )

    def seek(self, offset: int) -> int:
        """Read from control offset ``offset`` on (``status`` and tests read the whole history)."""
        self._consumer.assign([TopicPartition(self.topic, CONTROL_PARTITION, offset)])
        self._position = offset
        return offset

    @property
    def position(self) -> int:
        """The next control offset this reader will look at."""
        return self._position

    def watermarks(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
        """The log start (retention and delete-records move it up) and the last stable offset
        (everything below it is decided: committed or aborted), asked of the broker, not cached.

        A control topic the app has just created may not have its leader yet: a broker carrying
        10,000 partitions answered NOT_LEADER_FOR_PARTITION right after the creation, and the app
        stopped at start (``bench.wide_app --tables 3500``); transient answers are waited out."""
        low, high = retry_transient(
            lambda: self._consumer.get_watermark_offsets(self._tp, timeout=timeout_s, cached=False), timeout_s
        )
        return int(low), int(high)

    def end_offset(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        return self.watermarks(timeout_s)[1]

    def read_until(self, end: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[ControlEvent]:
        """Reads at least up to control offset ``end``: yields this sink's events not read yet, in order.

        Each event is yielded as soon as it is read, before the next poll. The caller records it
        (the coordinator's ``CommitState``) before anything can fail, so a timeout or consumer error
        halfway through loses nothing: the reader's position is already past those events and no
        later read would return them. One poll may return events at or beyond ``end``; they are
        yielded too (callers keep them for the next round) rather than buffered here.
        """
        deadline = time.monotonic() + timeout_s
        while self._position < end:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"control topic {self.topic!r} did not deliver offsets up to {end} within {timeout_s}s "
                    f"(reached {self._position}); is the broker reachable?"
                )
            yield from self._poll(0.2, end)

    def poll(self, timeout_s: float = 0.2) -> Iterator[ControlEvent]:
        """Whatever arrives within ``timeout_s`` (for a coordinator idling between rounds), yielded
        one by one for the same reason as in :meth:`read_until`."""
        return self._poll(timeout_s, None)

    def _poll(self, timeout_s: float, end: int | None) -> Iterator[ControlEvent]:
        fault_point("control.before-poll", position=self._position)
        msg = self._consumer.poll(timeout_s)
        while msg is not None:
            error = msg.error()
            offset = msg.offset() or 0
            if error is not None:
                if error.code() == KafkaError._AUTO_OFFSET_RESET:  # deleted (or recreated) under the reader
                    self.check_still_there(self._position)
                    raise KafkaException(error)
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                # Under read_committed EOF is at the last stable offset; transaction markers
                # below it occupy offsets no message is delivered for.
                self._position = max(self._position, offset)
            else:
                self._position = offset + 1
                if msg.key() == self._key:
                    event = ev.decode(msg.value() or b"")
                    if event.sink == self.sink:
                        yield ControlEvent(offset, event)
            if end is not None and self._position >= end:
                return
            fault_point("control.before-poll", position=self._position)
            msg = self._consumer.poll(0)

    def close(self) -> None:
        self._consumer.close()
