"""The control topic: where workers publish what they wrote and the coordinator reads it back.

Everything here exists to keep two promises. Events reach the coordinator only when their Kafka
transaction committed (``read_committed``, so an aborted attempt's files are never appended), and
events keep one total order (one partition), so "control offset" means the same thing to every
process and each table can record how far it has consumed.

Names derived from the sink name, in one place because every part must agree on them:

- ``fanout-sink-<sink>``: the sink-managed consumer group holding the source offsets. Nobody ever
  joins it; offsets arrive only through ``send_offsets_to_transaction`` with generation -1.
- ``fanout-sink-<sink>-coordinator``: the coordinator's group, holding its control-topic low watermark.
- ``fanout-sink-<sink>-<topic>-<partition>``: a worker's transactional id (stable per source partition).
- ``fanout-sink-<sink>-coordinator``: the coordinator's transactional id (stable per sink).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from fanout_sink.errors import TopicError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.client import DEFAULT_TIMEOUT_S, KafkaConf, client_conf, ensure_topic, retry_transient
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import events as ev

CONTROL_PARTITION = 0


def sink_group(sink: str) -> str:
    """The sink-managed group: source offsets delivered to the tables (source of truth, invariant I1)."""
    return f"fanout-sink-{sink}"


def coordinator_group(sink: str) -> str:
    """The coordinator's own group: control offsets every table has passed (the low watermark)."""
    return f"fanout-sink-{sink}-coordinator"


def worker_transactional_id(sink: str, topic: str, partition: int) -> str:
    return f"fanout-sink-{sink}-{topic}-{partition}"


def coordinator_transactional_id(sink: str) -> str:
    return f"fanout-sink-{sink}-coordinator"


def ensure_control_topic(kafka_conf: KafkaConf, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Create the control topic with one partition, or check that the existing one has exactly one."""
    partitions = ensure_topic(kafka_conf, topic, "control topic", timeout_s)
    if partitions != 1:
        raise TopicError(
            f"control topic {topic!r} has {partitions} partitions; the sink needs exactly 1 so that "
            "control offsets are one total order.\n"
            "  fix: point control.topic at a new name (the sink creates it), or recreate this topic "
            "with 1 partition."
        )


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

    def __init__(self, sink: str, kafka_conf: KafkaConf, topic: str) -> None:
        self.sink = sink
        self.topic = topic
        self._key = sink.encode()
        self._tp = TopicPartition(topic, CONTROL_PARTITION)
        self._consumer = Consumer(
            {
                **client_conf(kafka_conf),
                "group.id": coordinator_group(sink),
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        self._position = 0

    def seek_to_committed(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        """Start at the coordinator group's committed low watermark (or the beginning)."""
        committed = retry_transient(lambda: self._consumer.committed([self._tp], timeout=timeout_s))[0].offset
        return self.seek(committed if committed >= 0 else 0)

    def seek(self, offset: int) -> int:
        """Read from control offset ``offset`` on (``status`` and tests read the whole history)."""
        self._consumer.assign([TopicPartition(self.topic, CONTROL_PARTITION, offset)])
        self._position = offset
        return offset

    @property
    def position(self) -> int:
        """The next control offset this reader will look at."""
        return self._position

    def end_offset(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        """The last stable offset: everything below it is decided (committed or aborted)."""
        _low, high = self._consumer.get_watermark_offsets(self._tp, timeout=timeout_s, cached=False)
        return int(high)

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
