"""Keeping the sink group's offsets from expiring while the sink runs: idle partitions re-committed.

Nobody joins the sink group, so the broker expires each partition's committed offset
``offsets.retention.minutes`` after that partition's last commit, even while the app runs: a
partition that receives nothing for that long would lose its delivered position (start-up recovery
restores it from the control topic, :mod:`.recovery`, but only as far as the topic still proves it).
So the coordinator, after each round, re-commits a partition whose offset has not changed for
``interval`` with the same protocol and the same offset (:class:`~.recovery.PositionWriter`, the
sink group's one writer), which restarts its retention clock. The interval defaults to a quarter of
the broker's ``offsets.retention.minutes``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.offsets import PartitionPosition, offsets_retention_s
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.recovery import PositionWriter, TopicPartitionKey

log = logging.getLogger(__name__)

IDLE_WAIT_S = 5.0
"""How long a round's refresh waits for the running batch to end before leaving it to the next round."""


@dataclass
class OffsetRefresher:
    """Re-commits the offsets of partitions that have not committed for ``interval_s``.

    Keeps I1 while running: an idle partition's offset would otherwise expire. The sink group's
    committed offsets come from the coordinator's round (``source_positions``). A partition counts
    as committed "now" when it is first seen and whenever its offset changes; a refresh is due
    ``interval_s`` later. Only caught-up partitions are refreshed: one with records waiting is about
    to be committed by a worker, and refreshing it would fence that worker (I3). Under packing a
    refresh fences the partition's whole partition group, whose other partitions may be mid-delivery: with
    ``workers_idle`` (the app's batch lock) refreshes run between batches only, waiting for one at
    most :data:`IDLE_WAIT_S`, else left due for the next round.
    """

    channel: SinkChannel
    interval_s: float | None
    """None: a quarter of the broker's ``offsets.retention.minutes``, asked at the first refresh."""
    workers_idle: threading.Lock | None = None
    _seen: dict[TopicPartitionKey, tuple[int, float]] = field(default_factory=dict)

    def after_round(self, positions: list[PartitionPosition]) -> None:
        """A round read ``positions``: refresh what is due. A failure is only logged: the round
        itself is done, and an offset not refreshed now is retried after the next one."""
        if not positions:
            return
        try:
            if self.interval_s is None:
                self.interval_s = offsets_retention_s(self.channel.clients) / 4
                log.info("idle partitions' sink-group offsets are re-committed every %.0f s", self.interval_s)
            self.refresh(positions)
        except (KafkaException, TimeoutError, FanoutSinkError):
            log.warning("re-committing idle partitions' offsets failed; retrying next round", exc_info=True)

    def refresh(self, positions: list[PartitionPosition]) -> list[TopicPartitionKey]:
        """Refreshes what is due; returns the partitions whose offset was committed again."""
        now = time.monotonic()
        due: list[PartitionPosition] = []
        for position in positions:
            key = (position.topic, position.partition)
            last = self._seen.get(key)
            if position.committed is None:
                self._seen.pop(key, None)
            elif last is None or last[0] != position.committed:
                self._seen[key] = (position.committed, now)
            elif self.interval_s is not None and now - last[1] >= self.interval_s and position.caught_up:
                due.append(position)
        if not due:
            return []
        idle = self.workers_idle
        if idle is not None and not idle.acquire(timeout=IDLE_WAIT_S):
            log.info("a batch is running: idle partitions' offsets are re-committed after it")
            return []
        refreshed: list[TopicPartitionKey] = []
        writer = PositionWriter(self.channel)
        try:
            for position in due:
                key = (position.topic, position.partition)
                offset = position.committed
                assert offset is not None
                if writer.commit(position.topic, position.partition, offset, expected=offset) == offset:
                    refreshed.append(key)
                self._seen[key] = (offset, time.monotonic())
        finally:
            writer.close()
            if idle is not None:
                idle.release()
        log.info(
            "re-committed the unchanged offsets of %s so that the broker does not expire them",
            ", ".join(f"{t}[{p}]" for t, p in refreshed) or "no partition",
        )
        return refreshed
