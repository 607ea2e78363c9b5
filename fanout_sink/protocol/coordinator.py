"""The coordinator: turns committed ``DataWritten`` events into one Iceberg append per table per round.

It keeps the driver half of the invariants:

- I3: its producer's transactional id is stable per sink, so a second coordinator of the same sink
  fences the first (the first fails at its next Kafka transaction and stops). Between the two, a
  table commit still cannot append twice: every table commit checks, against freshly loaded table
  metadata, the control offset the table already holds, and PyIceberg's own commit retry (which
  would rebase the same append onto a new head without that check) is switched off.
- I4: each table's snapshot summary records the control offset it is committed up to (and so do
  the table properties, in the same commit, so that snapshot expiry cannot erase it); after any
  crash, events below it are skipped for that table only.

One table's commit (those checks, stale and missing files, change resolution, the snapshot) is
:mod:`fanout_sink.protocol.table_commit`'s, and who runs a round's commits (threads here, or the
Spark executors) is :attr:`Coordinator.table_commits`'s (:mod:`fanout_sink.protocol.commit_runners`);
the coordinator keeps the rounds around them, the control topic's events and transactions, and
reports the tables that keep failing (:mod:`fanout_sink.protocol.failing_tables`). What it is told
is fixed when it is built: its settings (:class:`CoordinatorSettings`) and its collaborators (the
channel, the catalog, the commit runner, the round trigger, the metrics observer).

Rounds start when :class:`~fanout_sink.protocol.round_trigger.RoundTrigger` says: as soon as every
planned range of a micro-batch has reported, at least every commit interval, never closer together
than the commit minimum interval. A round: publish ``StartCommit`` (fails fast when fenced), read
source positions (for VTTS), take the control topic's last stable offset as the round end, read up
to it, commit tables in parallel (wherever :attr:`Coordinator.table_commits` runs them), then in one
transaction publish ``CommitToTable``/``CommitComplete`` and move the coordinator group's offset to
the low watermark (the oldest control offset a table still needs).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaException, TopicPartition
from pyiceberg.catalog import Catalog

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import ProducerFencedError
from fanout_sink.faults import fault_point
from fanout_sink.kafka.offsets import PartitionPosition, source_positions
from fanout_sink.kafka.topics import max_message_bytes
from fanout_sink.kafka.transaction import TransactionalProducer
from fanout_sink.protocol import channel, offset_refresh, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import round_trigger as trigger
from fanout_sink.protocol.channel import ControlEvent, ControlReader, SinkChannel
from fanout_sink.protocol.commit_runners import RoundTables, TableCommitRunner, ThreadedCommits, outcomes
from fanout_sink.protocol.commit_state import CommitState, PendingFiles
from fanout_sink.protocol.failing_tables import FailingTables
from fanout_sink.protocol.offset_metadata import RoundMark
from fanout_sink.protocol.round_words import round_line
from fanout_sink.protocol.table_cadence import CommitIntervals, TableCadence
from fanout_sink.protocol.table_commit import TableCommit, TableCommitter

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How long the thread waits for control events between two looks at the trigger: a batch's last
report starts its round within this."""


@dataclass(frozen=True)
class CoordinatorSettings:
    """What the sink's settings tell its coordinator (``source:`` and ``control:``), seconds named as
    such; :meth:`of` reads them from the config, tools and tests state them."""

    source_topics: tuple[str, ...] = ()
    source_pattern: str | None = None
    """Matched again every round, so a topic created while the sink runs counts for VTTS, lag and
    offset refreshes as soon as it exists."""
    commit_interval_s: float = 30.0
    commit_timeout_s: float = 60.0
    offsets_refresh_interval_s: float | None = None
    """None: a quarter of the broker's ``offsets.retention.minutes``."""
    max_parallel_commits: int = 4
    """Commit threads of the default runner (:class:`~.commit_runners.ThreadedCommits`)."""
    commit_intervals: CommitIntervals = field(default_factory=CommitIntervals)  # none: every round

    @classmethod
    def of(cls, config: SinkConfig) -> CoordinatorSettings:
        control = config.control
        refresh = control.offsets_refresh_interval
        return cls(
            source_topics=tuple(config.source.topics),
            source_pattern=config.source.pattern,
            commit_interval_s=control.commit_interval.total_seconds(),
            commit_timeout_s=control.commit_timeout.total_seconds(),
            offsets_refresh_interval_s=refresh.total_seconds() if refresh else None,
            commit_intervals=CommitIntervals.of(config),
        )


@dataclass
class RoundResult:
    commit_id: str
    round_end: int
    low_watermark: int
    vtts_ms: int | None
    tables: dict[str, TableCommit] = field(default_factory=dict)
    waiting: frozenset[str] = frozenset()  # tables whose files wait for their commit-interval
    reason: str = trigger.CALL
    """Why the round ran: one of ``round_trigger.REASONS``."""
    seconds: float = 0.0  # the round's wall time, lock wait included (set by commit_round)


class RoundObserver(Protocol):
    """Told the outcome of every commit round (the app's metrics); called on the coordinator's thread
    after the round, so an observer must be quick and must not raise."""

    def round_done(self, result: RoundResult, positions: list[PartitionPosition]) -> None: ...

    def round_failed(self, error: BaseException) -> None: ...


class Coordinator:
    """One per sink: ``open()``, then ``start()``/``stop()`` (a thread) or ``commit_round()`` directly."""

    def __init__(
        self,
        channel: SinkChannel,
        catalog: Catalog,
        settings: CoordinatorSettings,
        *,
        table_commits: TableCommitRunner | None = None,
        rounds: trigger.RoundTrigger | None = None,
        observer: RoundObserver | None = None,
        workers_idle: threading.Lock | None = None,
        cadence: TableCadence | None = None,
    ) -> None:
        """``table_commits``: who runs a round's table commits (none: ``settings.max_parallel_commits``
        threads of this process; the app's also spreads large rounds over its Spark executors,
        ``fanout_sink.spark.executor_commits``). ``rounds``: when the thread's next round is due (the
        driver tells it what each batch planned). ``workers_idle``: held while workers deliver (the
        app's batch lock); idle partitions' offsets are refreshed only while it is free
        (:class:`~.offset_refresh.OffsetRefresher`). ``cadence``: which tables a round commits
        (none: by ``settings.commit_intervals`` on the wall clock)."""
        self.channel = channel
        self.sink = channel.sink
        self.control_topic = channel.control_topic
        self.catalog = catalog
        self.settings = settings
        self.timeout_s = channel.timeout_s
        self.state = CommitState()
        self.table_commits: TableCommitRunner = table_commits or ThreadedCommits(
            TableCommitter(self.sink, catalog), max(1, settings.max_parallel_commits)
        )
        self.rounds = rounds or trigger.RoundTrigger(settings.commit_interval_s)
        self.cadence = cadence or TableCadence(settings.commit_intervals)
        self.observer = observer
        self._producer: TransactionalProducer | None = None
        self._reader: ControlReader | None = None
        self._group_metadata: bytes | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._fenced = False
        self._max_message_bytes: int | None = None
        self.error: BaseException | None = None
        self.last_round: RoundResult | None = None
        self.failing = FailingTables()
        """Tables whose commit failed in the latest rounds, by identifier."""
        self._refresher = offset_refresh.OffsetRefresher(
            channel, settings.offsets_refresh_interval_s, workers_idle
        )
        """Re-commits idle partitions' sink-group offsets after each round, before the broker expires
        them (the group is never joined, so an offset lives ``offsets.retention.minutes``)."""

    # -- life cycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Create/check the control topic, fence any older coordinator, seek to the low watermark."""
        channel.ensure_control_topic(self.channel)
        self._producer = self._new_producer()
        self._producer.initialize()
        self._group_metadata = self.channel.clients.group_metadata(self.channel.coordinator_group)
        self._reader = ControlReader(self.channel)
        start = recovery.seek_to_low_watermark(self._reader)
        log.info("coordinator of sink %r reads the control topic from offset %d", self.sink, start)
        committed, offset_metadata = self._reader.committed(self.timeout_s)
        mark = RoundMark.decode(offset_metadata)
        if committed is not None and start > committed and mark is not None:
            # Retention deleted only events no table needed (recovery.seek_to_low_watermark): the
            # new log start is acknowledged at once, so that a crash before the first round, after
            # workers wrote again, does not find the deletion unexplained.
            moved = mark.moved_to(start).encode()
            self._publish(
                [], [TopicPartition(self.control_topic, channel.CONTROL_PARTITION, start, metadata=moved)]
            )

    def start(self) -> None:
        """Run rounds in a daemon thread (the Spark driver hosts it) whenever :attr:`rounds` says one
        is due: a planned batch reported completely, or ``commit_interval_s`` passed."""
        if self._producer is None:
            self.open()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"fanout-sink-coordinator-{self.sink}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        failed = 0  # rounds failed in a row: the first is a WARNING, the repeats DEBUG, the recovery INFO
        try:
            while not self._stopping.is_set():
                try:
                    # Polling can fail too: after a failed round the producer is re-created, and its
                    # init_transactions times out while the broker is away.
                    self.poll_once(POLL_S)
                    reason = self.rounds.due()
                    if reason is None:
                        continue
                    self.commit_round(reason)
                except (KafkaException, TimeoutError) as exc:  # TransactionStuckError: a TimeoutError
                    # Broker unreachable or restarting: nothing was lost (files stay pending,
                    # tables re-check their offsets, a reported batch stays due), so try again.
                    failed += 1
                    log.log(
                        logging.WARNING if failed == 1 else logging.DEBUG,
                        "commit round of sink %r failed (%s); retrying when the next round is due "
                        "(a planned batch reported, or at least every %.0f s), quietly until one succeeds",
                        self.sink,
                        exc,
                        self.settings.commit_interval_s,
                    )
                    log.debug("commit round of sink %r failed", self.sink, exc_info=True)
                    self._stopping.wait(min(1.0, self.settings.commit_interval_s))
                else:
                    if failed:
                        log.info("commit rounds of sink %r succeed again after %d failed", self.sink, failed)
                    failed = 0
        except BaseException as exc:
            log.exception("coordinator of sink %r stopped", self.sink)
            self.error = exc

    def stop(self, commit_now: bool = True) -> RoundResult | None:
        """Stop the thread; with ``commit_now`` run one last round (shutdown, end of an available-now run)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.settings.commit_timeout_s + self.timeout_s)
            self._thread = None
        if self.error is not None:
            raise self.error
        if not commit_now:
            return None
        self._read_reports_of_finished_batches()
        return self.commit_round(trigger.STOP)

    def _read_reports_of_finished_batches(self) -> None:
        """Wait (at most the Kafka timeout) until the reports of every batch the driver finished are
        readable: a transaction's markers may be written just after its commit returned, and a final
        round that ran before them would leave that batch's files to the next start (an
        available-now run would end with tables behind what it delivered)."""
        deadline = time.monotonic() + self.timeout_s
        with contextlib.suppress(KafkaException, TimeoutError):  # the round then fails the same way
            while self.rounds.unreported() and time.monotonic() < deadline:
                self.poll_once(0.2)
        if waiting := self.rounds.unreported():
            log.warning(
                "sink %r stops with batches %s reported only in part; the next start commits the rest",
                self.sink,
                waiting,
            )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._producer = None

    # -- rounds -----------------------------------------------------------------------------------

    def _ready(self) -> tuple[TransactionalProducer, ControlReader]:
        if self._fenced:
            # Re-opening would fence the newer coordinator back: a fenced coordinator stays down.
            raise ProducerFencedError(f"coordinator of sink {self.sink!r} was fenced and cannot be reused")
        if self._reader is None:
            self.open()
        elif self._producer is None or not self._producer.usable:  # a new one fences the old
            self._producer = self._new_producer()
        assert self._producer is not None and self._reader is not None
        if not self._producer.initialized:  # timed out before (the broker away): the same producer again
            self._producer.initialize()
        return self._producer, self._reader

    def _limit(self) -> int:
        """The control topic's message size limit, asked once per coordinator."""
        if self._max_message_bytes is None:
            self._max_message_bytes = max_message_bytes(self.channel.clients, self.control_topic)
        return self._max_message_bytes

    def _new_producer(self) -> TransactionalProducer:
        """The coordinator's transactional producer; creating it fences any older holder of the id.
        Its batches stay within the control topic's limit (a round's events go out back to back)."""
        txn_id = self.channel.coordinator_transactional_id
        return TransactionalProducer(
            self.channel.clients,
            txn_id,
            batch_bytes=self._limit(),
            initialize=False,
            fenced_message=(
                f"coordinator of sink {self.sink!r} was fenced: another coordinator with transactional "
                f"id {txn_id!r} started. This one stops; make sure only one application runs per sink name."
            ),
        )

    def poll_once(self, timeout_s: float = 0.5) -> int:
        """Read whatever committed events arrived; returns how many of this sink's events came in."""
        with self._lock:
            _, reader = self._ready()
            found = 0
            for item in reader.poll(timeout_s):  # each event is pending before the next poll can fail
                self._take(item)
                found += 1
            return found

    def _take(self, item: ControlEvent) -> None:
        """One committed event of this sink read: pending in the state, and seen by the trigger."""
        self.state.add(item)
        self.rounds.observe(item)

    def _publish(self, payloads: list[ev.Payload], offsets: list[TopicPartition] | None = None) -> None:
        producer, _ = self._ready()
        try:
            # A producer given up after a failure is replaced by the next round's, which fences it;
            # the control reader and the pending state stay.
            with producer.transaction():
                for payload in payloads:
                    channel.produce_event(producer, self.control_topic, self.sink, payload)
                if offsets:
                    assert self._group_metadata is not None
                    producer.send_offsets(offsets, self._group_metadata)
        except ProducerFencedError:
            self._fenced = True
            raise

    def commit_round(self, reason: str = trigger.CALL) -> RoundResult:
        """One commit round, synchronously (tools and tests call it directly; the thread when
        :attr:`rounds` says one is due, ``reason`` telling why)."""
        started = time.monotonic()
        try:
            result, positions = self._round(reason)
        except Exception as exc:
            if self.observer is not None:
                self.observer.round_failed(exc)
            raise
        result.seconds = time.monotonic() - started
        if self.observer is not None:
            self.observer.round_done(result, positions)
        return result

    def _round(self, reason: str) -> tuple[RoundResult, list[PartitionPosition]]:
        with self._lock:
            _, reader = self._ready()
            # Before the control end is read: the batches complete now have their events below it.
            self.rounds.started()
            started_s, commit_id = self.cadence.now(), str(uuid.uuid4())
            self._publish([ev.StartCommit(commit_id=commit_id)])
            topics, pattern = list(self.settings.source_topics), self.settings.source_pattern
            sourced, clients, group = bool(topics or pattern), self.channel.clients, self.channel.sink_group
            positions = source_positions(clients, group, topics, pattern) if sourced else []
            round_end = reader.end_offset(self.timeout_s)
            # Each event is pending before the next poll: a read failing halfway fails the round,
            # but what was read stays in the state and holds the low watermark back.
            for item in reader.read_until(round_end, self.timeout_s):
                self._take(item)
            vtts = self.state.vtts(positions, round_end) if sourced else None
            due, waiting = self.cadence.split(self.state.due(round_end), started_s, reason, self.failing)
            result = RoundResult(commit_id, round_end, round_end, vtts, reason=reason)
            result.waiting = frozenset(waiting)
            result.tables = self._commit_tables(due, round_end, commit_id, vtts, not waiting)
            self.cadence.ran(started_s)
            for identifier, outcome in result.tables.items():
                if outcome.outcome != "failed":
                    self.state.settle(identifier, round_end)
            result.low_watermark = self.state.low_watermark(round_end)
            fault_point("coordinator.before-complete", commit_id=commit_id)
            payloads: list[ev.Payload] = [
                ev.CommitToTable(
                    commit_id=commit_id,
                    table=due[t][0].event.table.model_copy(update={"uuid": outcome.table_uuid}),
                    snapshot_id=outcome.snapshot_id,
                    vtts_ms=vtts,
                    control_offset=floor,
                )
                for t, outcome in result.tables.items()
                if (floor := outcome.floor_after(round_end)) is not None
            ]
            times, reports_below = self.state.checkpoint(round_end)
            complete = ev.CommitComplete(
                commit_id=commit_id,
                vtts_ms=vtts,
                partition_times=times,
                reports_below=reports_below,
                low_watermark=result.low_watermark,
                **self.state.delivered.round_fields(),
            )
            # About 60 bytes per source partition: sized against the control topic, in parts.
            payloads.extend(
                ev.split_round(complete, self.sink, channel.event_budget(self.sink, self._limit()))
            )
            # The mark outlives the topic's retention: it tells a restart whether deleted events mattered.
            mark = RoundMark.of_round(round_end, len(payloads)).encode()
            watermark = TopicPartition(
                self.control_topic, channel.CONTROL_PARTITION, result.low_watermark, metadata=mark
            )
            self._publish(payloads, [watermark])
            self.rounds.done(round_end)
            self.last_round = result
            self._refresher.after_round(positions)
            if result.tables or waiting:
                line = round_line(commit_id, reason, result.tables, vtts, len(waiting))
                log.info("%s", line, extra={"commit_id": commit_id})
            return result, positions

    def _commit_tables(
        self,
        due: dict[str, list[PendingFiles]],
        round_end: int,
        commit_id: str,
        vtts: int | None,
        whole: bool,
    ) -> dict[str, TableCommit]:
        if not due:
            return {}
        uuids = {p.event.table.uuid for items in due.values() for p in items}
        tables = RoundTables(
            due,
            round_end,
            commit_id,
            vtts,
            deadline=time.monotonic() + self.settings.commit_timeout_s,
            floors={u: f for u, f in self.state.committed_through.items() if u in uuids},
            failing=frozenset(self.failing),
            # A consistent point: no table's files below the end wait (``whole``), no transaction cut.
            tables=len(due) if whole and self.state.cuts_no_transaction(round_end) else None,
            merging=self.cadence.merging(due),
        )
        results = outcomes(self.table_commits, tables)
        self.failing.record(due, results)
        return results
