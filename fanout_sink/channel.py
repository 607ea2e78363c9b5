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

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from fanout_sink import events as ev
from fanout_sink.errors import TopicError, TransactionStuckError

CONTROL_PARTITION = 0
DEFAULT_TIMEOUT_S = 30.0
_T = TypeVar("_T")
_TRANSIENT = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNSTABLE_OFFSET_COMMIT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.NOT_LEADER_FOR_PARTITION,  # a just-created topic, before its leader is ready
    KafkaError.LEADER_NOT_AVAILABLE,
}


def retry_transient(call: Callable[[], _T], timeout_s: float = DEFAULT_TIMEOUT_S) -> _T:
    """Run ``call`` again while the broker answers with a transient error (a group coordinator that
    is still loading, a pending transactional offset commit), up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            transient = isinstance(error, KafkaError) and (error.code() in _TRANSIENT or error.retriable())
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


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


def _client_conf(kafka_conf: dict[str, Any]) -> dict[str, Any]:
    """Client properties without consumer/producer-only keys that the other client type rejects."""
    return {k: v for k, v in kafka_conf.items() if k not in {"group.id", "transactional.id"}}


def ensure_topic(
    kafka_conf: dict[str, Any], topic: str, purpose: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    """Create ``topic`` (one partition) unless it exists; its partition count once it has a leader.

    The sink's own topics must exist before the first transaction writes to them: brokers usually
    refuse to auto-create topics, and a produce to a missing topic waits in the transaction until
    the commit times out, far from the cause.
    """
    admin = AdminClient(_client_conf(kafka_conf))
    metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        futures = admin.create_topics([NewTopic(topic, num_partitions=1)], operation_timeout=timeout_s)
        try:
            futures[topic].result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(
                    f"could not create {purpose} {topic!r}: {exc.args[0].str()}\n"
                    "  fix: create it by hand, or grant the sink CREATE on the cluster."
                ) from exc
    # A topic just created (by us or a concurrent process) shows no partitions until a leader is elected.
    deadline = time.monotonic() + timeout_s
    while (metadata is None or metadata.error is not None or not metadata.partitions) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
        metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    return len(metadata.partitions) if metadata is not None else 0


def ensure_control_topic(
    kafka_conf: dict[str, Any], topic: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Create the control topic with one partition, or check that the existing one has exactly one."""
    partitions = ensure_topic(kafka_conf, topic, "control topic", timeout_s)
    if partitions != 1:
        raise TopicError(
            f"control topic {topic!r} has {partitions} partitions; the sink needs exactly 1 so that "
            "control offsets are one total order.\n"
            "  fix: point control.topic at a new name (the sink creates it), or recreate this topic "
            "with 1 partition."
        )


def transactional_producer(
    kafka_conf: dict[str, Any], transactional_id: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Producer:
    """A producer whose ``init_transactions`` has run, so every older holder of the id is fenced."""
    conf = {"transaction.timeout.ms": 60000, **_client_conf(kafka_conf), "transactional.id": transactional_id}
    producer = Producer(conf)
    producer.init_transactions(timeout_s)
    return producer


def send_offsets(
    producer: Producer, offsets: list[TopicPartition], metadata: Any, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """``send_offsets_to_transaction`` with a deadline that holds.

    librdkafka can block in it far past its timeout when the group coordinator goes away during
    the call, e.g. across a broker restart (confluentinc/librdkafka#5456 and #5511; seen here with
    confluent-kafka 2.16.1 by the chaos runner: a coordinator stalled for minutes, then was fenced
    by the broker's transaction timeout). The call runs in a helper thread; past the deadline,
    :class:`TransactionStuckError` tells the caller to drop this producer and fence it with a new one.
    """
    done = threading.Event()
    failure: list[BaseException] = []

    def call() -> None:
        try:
            producer.send_offsets_to_transaction(offsets, metadata, timeout_s)
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=call, name="send-offsets-to-transaction", daemon=True).start()
    if not done.wait(timeout_s + 5.0):
        raise TransactionStuckError(
            f"send_offsets_to_transaction for {[(tp.topic, tp.partition) for tp in offsets]} did not return "
            f"within {timeout_s + 5.0:.0f}s (a librdkafka hang after a broker restart); the producer is "
            "replaced and its transaction aborted"
        )
    if failure:
        raise failure[0]


def memberless_group_metadata(kafka_conf: dict[str, Any], group: str) -> bytes:
    """Group metadata of a consumer that never subscribes: generation -1, plain bytes (shippable).

    The broker accepts transactional offset commits with generation -1 only while the group has no
    members, which is why no process may ever join the sink-managed group.
    """
    holder = Consumer({**_client_conf(kafka_conf), "group.id": group})
    try:
        metadata: bytes = holder.consumer_group_metadata()
    finally:
        holder.close()
    return metadata


def is_fenced(error: KafkaError) -> bool:
    """A fenced producer is dead for good: it must be dropped and a new one created."""
    return bool(error.fatal()) or error.code() in {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }


def produce_event(producer: Producer, topic: str, sink: str, payload: ev.Payload) -> None:
    """Queue one event; keyed by sink name so other sinks' readers can skip it without decoding."""
    producer.produce(topic, key=sink.encode(), value=ev.encode(ev.Event(sink=sink, payload=payload)))


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

    def __init__(self, sink: str, kafka_conf: dict[str, Any], topic: str) -> None:
        self.sink = sink
        self.topic = topic
        self._key = sink.encode()
        self._tp = TopicPartition(topic, CONTROL_PARTITION)
        self._consumer = Consumer(
            {
                **_client_conf(kafka_conf),
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

    def read_until(self, end: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ControlEvent]:
        """Reads at least up to control offset ``end``: this sink's events not read yet, in order.

        One poll may return events at or beyond ``end``; they are returned too (callers keep them
        for the next round) rather than buffered here.
        """
        found: list[ControlEvent] = []
        deadline = time.monotonic() + timeout_s
        while self._position < end:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"control topic {self.topic!r} did not deliver offsets up to {end} within {timeout_s}s "
                    f"(reached {self._position}); is the broker reachable?"
                )
            found.extend(self._poll(0.2, end))
        return found

    def poll(self, timeout_s: float = 0.2) -> list[ControlEvent]:
        """Whatever arrives within ``timeout_s`` (for a coordinator idling between rounds)."""
        return list(self._poll(timeout_s, None))

    def _poll(self, timeout_s: float, end: int | None) -> Iterator[ControlEvent]:
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
            msg = self._consumer.poll(0)

    def close(self) -> None:
        self._consumer.close()
