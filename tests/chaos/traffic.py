"""The chaos run's producer: records with unique ids, written at a steerable rate through broker restarts.

With change traffic on (``changes``), the same producer writes the change stream's messages beside the
records, in the stream's order and spread over the run in step with them (after a share of the records,
the same share of the changes), so every breakage finds changes in flight too.

The verdict compares tables with what the source topics hold, so this producer only has to be honest
about what it attempted; it is idempotent (no duplicates from its own retries) and patient (a message
waits out a broker restart instead of timing out), so the topics hold each record exactly once.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from chaos.changes import ChangeTraffic
from fanout_sink.kafka.clients import KafkaClientFactory

# Share of each record kind; ``noise`` matches no route (filtered), ``bad`` is malformed JSON.
KINDS: dict[str, float] = {"order": 0.33, "payment": 0.2, "click": 0.35, "noise": 0.1, "bad": 0.02}
REGIONS = ("eu", "us", "apac")


@dataclass
class TrafficStats:
    attempted: int = 0
    changes: int = 0
    """Change-stream messages produced (events and tombstones); ``acked`` and ``failed`` count both."""
    acked: int = 0
    failed: int = 0


def record(seq: int, rng: random.Random, prefix: str) -> tuple[str, bytes]:
    """One record's id and value; the id is also the key, so a dead letter can be traced back."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    rid = f"{prefix}-{seq:09d}"
    ts = 1_700_000_000_000 + seq
    if kind == "bad":
        return rid, f'{{"id": "{rid}", "type": "order", "amount": '.encode()
    body: dict[str, object] = {"id": rid, "type": kind, "seq": seq, "ts": ts}
    if kind in {"order", "payment"}:
        body.update(region=rng.choice(REGIONS), amount=round(rng.uniform(1, 500), 2))
    elif kind == "click":
        body.update(region=rng.choice(REGIONS), page=f"/p/{rng.randrange(1000)}")
    return rid, json.dumps(body, separators=(",", ":")).encode()


class Traffic:
    """A background producer of ``total`` records over ``topics``, and of ``changes`` alongside;
    ``rate`` (records/s) may change."""

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        total: int,
        seed: int,
        rate: float = 1e3,
        changes: ChangeTraffic | None = None,
    ) -> None:
        self.topics = topics
        self.total = total
        self.changes = changes
        self.rate = rate
        self.stats = TrafficStats()
        self._rng = random.Random(seed)
        self._prefix = f"r{seed}"
        self._bootstrap = bootstrap
        self._producer = self._new_producer()
        self._stop = threading.Event()
        self._paused = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chaos-traffic", daemon=True)

    def _new_producer(self) -> Producer:
        return KafkaClientFactory({"bootstrap.servers": self._bootstrap}).producer(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                # A broker restart must delay records, never drop them: wait far longer than one.
                "message.timeout.ms": 900_000,
            }
        )

    def start(self) -> None:
        self._thread.start()

    def pause(self, timeout_s: float = 120.0) -> None:
        """Stop producing and wait until what was produced is acknowledged (a topic is about to go)."""
        with self._lock:
            self._paused = True
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise TimeoutError(f"{remaining} record(s) still unacknowledged after {timeout_s:.0f}s")

    def resume(self) -> None:
        """Produce again, with a new producer: the idempotent one's sequence numbers belong to the
        partitions of a topic that may be gone."""
        with self._lock:
            self._producer = self._new_producer()
            self._paused = False

    @property
    def done(self) -> bool:
        return self.stats.attempted >= self.total and self.stats.changes >= len(self.changes or ())

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.stats.acked += 1
        else:
            self.stats.failed += 1

    def _produce(self, topic: str, value: bytes | None, key: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:  # the queue is full while the broker is away: wait for room
                self._producer.poll(0.5)

    def _run(self) -> None:
        chunk = 50
        while not self._stop.is_set() and not self.done:
            started = time.monotonic()
            with self._lock:
                if not self._paused:
                    self._chunk(chunk)
            self._stop.wait(max(0.0, chunk / max(self.rate, 1.0) - (time.monotonic() - started)))

    def _chunk(self, chunk: int) -> None:
        for _ in range(min(chunk, self.total - self.stats.attempted)):
            seq = self.stats.attempted
            rid, value = record(seq, self._rng, self._prefix)
            self._produce(self.topics[seq % len(self.topics)], value, rid.encode())
            self.stats.attempted += 1
        if self.changes is not None:
            due = math.ceil(len(self.changes) * self.stats.attempted / max(self.total, 1))
            for index in range(self.stats.changes, due):
                self._produce(self.changes.topic, self.changes.values[index], self.changes.keys[index])
                self.stats.changes += 1
        self._producer.poll(0)

    def stop(self) -> None:
        """Stop producing (a run that failed); records already queued get a short chance to go out."""
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(5)

    def close(self, timeout_s: float = 120.0) -> TrafficStats:
        """End the traffic where it is now, as if its total were what it produced so far, and wait
        for the acknowledgements: for a run that needs records flowing until some event, not after.
        Append traffic only (a change stream keeps its length)."""
        assert self.changes is None, "a change stream cannot end early"
        with self._lock:
            self.total = self.stats.attempted
        return self.finish(timeout_s)

    def finish(self, timeout_s: float = 900.0) -> TrafficStats:
        """Wait until every record was produced and acknowledged (or ``timeout_s`` passed)."""
        deadline = time.monotonic() + timeout_s
        while not self.done and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.2)
        self._stop.set()
        self._thread.join(30)
        remaining = self._producer.flush(max(1.0, deadline - time.monotonic()))
        if remaining:
            raise TimeoutError(f"{remaining} record(s) still unacknowledged after {timeout_s:.0f}s")
        return self.stats


def flood(bootstrap: str, topic: str, partition: int, prefix: str, count: int, oversized_bytes: int) -> int:
    """A burst of ``count`` malformed records into one partition, then one malformed record of
    ``oversized_bytes`` (bigger than a producer's default ``message.max.bytes``, so its dead letter
    cannot be produced as it is); the records written. The partition's topic must allow such a
    message (``max.message.bytes``)."""
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
            "message.max.bytes": oversized_bytes + 65_536,
            "queue.buffering.max.messages": count + 1,
        }
    )
    for seq in range(count):
        rid = f"{prefix}-{seq:09d}"
        producer.produce(
            topic, f'{{"id": "{rid}", "type": "order", "amount": '.encode(), rid.encode(), partition
        )
    rid = f"{prefix}-oversized"
    padding = b"x" * oversized_bytes
    producer.produce(topic, f'{{"id": "{rid}", "pad": "'.encode() + padding, rid.encode(), partition)
    remaining = producer.flush(120)
    if remaining:
        raise TimeoutError(f"{remaining} flood record(s) unacknowledged after 120s")
    return count + 1
