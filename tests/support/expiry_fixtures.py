"""Real offset expiry without waiting a minute for it in the middle of the suite.

The broker expires a memberless group's offsets a minute after their last commit at the earliest
(``offsets.retention.minutes`` cannot go lower). The scenarios that need it (tests/protocol/
test_recovery.py) are therefore arranged at the start of the pytest session, in a background thread,
on a private broker with the chaos run's retention (``kills.BROKER_PROPERTIES``), while the other
tests run. The ``expired`` fixture then polls until every awaited offset is really gone: usually
already, or after the rest of the minute when only these tests were selected.

Each scenario has its own sink (``support.sink_factory``), topic and embedded catalog; the arrangement
is the "given" part of the test named in its docstring, the tests do the rest.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest
from chaos import kills
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.common import create_topic, produce_json, write_checkpoint_batch
from support.sink_factory import SinkUnderTest, new_sink

from fanout_sink.devtools.stack.broker import KafkaBroker, stop_pid
from fanout_sink.kafka.clients import KafkaClientFactory, retry_transient
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol import channel
from fanout_sink.protocol.worker import SliceWorker

USERS = ("expiring_broker", "expired")
"""The fixtures whose use makes the session arrange the scenarios at its start."""
EARLIEST = {"starting-offsets": "earliest"}


def _wait_until_expired(
    bootstrap: str, group: str, topic: str, partition: int, timeout_s: float = 240
) -> None:
    """Polls the group's committed offset until the broker has expired it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        while consumer.committed([TopicPartition(topic, partition)], timeout=30)[0].offset >= 0:
            assert time.monotonic() < deadline, f"{group} {topic}[{partition}] never expired"
            time.sleep(1)
    finally:
        consumer.close()


@dataclass(frozen=True)
class Memberless:
    """A group that never joined, with offsets committed on both partitions of its topic."""

    bootstrap: str
    group: str
    topic: str
    committed: list[int | None]


@dataclass(frozen=True)
class Expired:
    """The arranged scenarios; once the ``expired`` fixture returns them, their awaited offsets are gone."""

    bootstrap: str
    memberless: Memberless
    recovered: SinkUnderTest
    last_round: SinkUnderTest
    replayed: SinkUnderTest
    replay_worker: SliceWorker
    idle: SinkUnderTest
    idle_coordinator: subprocess.Popen[bytes]


def _scenario_sink(bootstrap: str, prefix: str, folder: Path) -> SinkUnderTest:
    """A scenario's sink: one single-partition topic, tables a and b in its own embedded catalog."""
    return new_sink(bootstrap, folder, partitions={"src": 1}, prefix=prefix, tables="ab", source=EARLIEST)


def canary_group(sink: str) -> str:
    return f"canary-{sink}"


def _commit(consumer: Consumer, topic: str, offsets: dict[int, int]) -> None:
    """Commit as a group that never joins; retried while the just-started broker's group coordinator
    still loads (the session's other tests keep the machine busy meanwhile)."""
    positions = [TopicPartition(topic, partition, offset) for partition, offset in offsets.items()]
    try:
        retry_transient(lambda: consumer.commit(offsets=positions, asynchronous=False))
    finally:
        consumer.close()


def _arrange_memberless(bootstrap: str) -> Memberless:
    """Commit offsets 0 on two partitions for a group that never joins (as the sink group is)."""
    group, topic = f"fanout-sink-m{uuid.uuid4().hex[:6]}", create_topic(bootstrap, "src", 2)
    _commit(Consumer({"bootstrap.servers": bootstrap, "group.id": group}), topic, {0: 0, 1: 0})
    positions = source_positions(KafkaClientFactory({"bootstrap.servers": bootstrap}), group, [topic])
    return Memberless(bootstrap, group, topic, [p.committed for p in positions])


def _arrange_recovered(s: SinkUnderTest) -> None:
    """Deliver [0, 6); the checkpoint committed batch 0 at 6."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    with contextlib.closing(s.worker()) as worker:
        s.deliver(worker, 6)
    write_checkpoint_batch(s.checkpoint, 0, {s.topic: {0: 6}})


def _arrange_idle(s: SinkUnderTest, cleanup: contextlib.ExitStack) -> subprocess.Popen[bytes]:
    """Deliver [0, 3), commit a canary group at 3, start a coordinator that refreshes every 10 s. It
    runs for the whole session, so it runs in a child process: in this one, other tests' fault
    callbacks (``faults.register``, process-wide) would fire in its thread too."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(3)])
    with contextlib.closing(s.worker()) as worker:
        s.deliver(worker, 3)
    _commit(Consumer({**s.config.kafka, "group.id": canary_group(s.name)}), s.topic, {0: 3})
    serve = {"commit_interval_s": 1.0, "offsets_refresh_interval_s": 10.0}
    idle_log(s).parent.mkdir(parents=True, exist_ok=True)
    with idle_log(s).open("wb") as log:
        child = subprocess.Popen(
            s.child_command("coordinator", json.dumps(serve)), stdout=log, stderr=subprocess.STDOUT
        )
    cleanup.callback(child.wait)  # runs last: callbacks run in reverse
    cleanup.callback(stop_pid, child.pid, 60.0)
    return child


def idle_log(s: SinkUnderTest) -> Path:
    """Where the idle scenario's coordinator process writes its output."""
    return s.checkpoint.parent / "idle-coordinator.log"


def _arrange_last_round(s: SinkUnderTest) -> None:
    """Deliver [0, 6) and [6, 9); the checkpoint committed only batch 0 (at 6); a coordinator round
    runs, then retention deletes the control events below its low watermark."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(9)])
    with contextlib.closing(s.worker()) as worker:
        s.deliver(worker, 6)
        s.deliver(worker, 9)
    write_checkpoint_batch(s.checkpoint, 0, {s.topic: {0: 6}})
    coordinator = s.coordinator()
    watermark = coordinator.commit_round().low_watermark
    coordinator.close()
    cut = TopicPartition(s.config.control_topic, 0, watermark)
    admin = AdminClient(s.config.kafka)  # kept referenced: a collected client never resolves its futures
    admin.delete_records([cut])[cut].result(30)


def _arrange_replayed(s: SinkUnderTest, cleanup: contextlib.ExitStack) -> SliceWorker:
    """Deliver [0, 6) with a worker that stays open (the sink keeps running)."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    worker = s.worker()
    cleanup.callback(worker.close)
    s.deliver(worker, 6)
    return worker


def _arrange(cleanup: contextlib.ExitStack) -> Expired:
    """Start the broker and arrange every scenario; everything started is closed by ``cleanup``."""
    root = Path(tempfile.mkdtemp(prefix="fanout-sink-expiry-"))
    cleanup.callback(shutil.rmtree, root, ignore_errors=True)
    broker = KafkaBroker(root / "kafka", properties=kills.BROKER_PROPERTIES)
    cleanup.callback(broker.stop)
    bootstrap = broker.start().bootstrap_servers
    memberless = _arrange_memberless(bootstrap)  # the first commit: expired by the others' wait
    idle, recovered, last_round, replayed = (_scenario_sink(bootstrap, p, root / p) for p in "iery")
    idle_coordinator = _arrange_idle(idle, cleanup)
    _arrange_recovered(recovered)
    _arrange_last_round(last_round)
    replay_worker = _arrange_replayed(replayed, cleanup)
    return Expired(
        bootstrap, memberless, recovered, last_round, replayed, replay_worker, idle, idle_coordinator
    )


@dataclass
class _Arrangement:
    future: Future[Expired]
    cleanup: contextlib.ExitStack


_ARRANGEMENT = pytest.StashKey[_Arrangement]()


def _start(config: pytest.Config) -> _Arrangement:
    """The arrangement, started in a background thread on first call."""
    if _ARRANGEMENT not in config.stash:
        cleanup = contextlib.ExitStack()
        future: Future[Expired] = Future()

        def run() -> None:
            try:
                future.set_result(_arrange(cleanup))
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=run, name="expiry-arrangement", daemon=True).start()
        config.stash[_ARRANGEMENT] = _Arrangement(future, cleanup)
    return config.stash[_ARRANGEMENT]


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(name in USERS for item in session.items for name in getattr(item, "fixturenames", ())):
        _start(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    arrangement = session.config.stash.get(_ARRANGEMENT, None)
    if arrangement is not None:
        with contextlib.suppress(BaseException):
            arrangement.future.exception(timeout=300)  # let a running arrangement finish first
        arrangement.cleanup.close()


@pytest.fixture(scope="session")
def expiring_broker(request: pytest.FixtureRequest) -> str:
    """A broker that expires a memberless group's offsets one minute after their last commit."""
    return _start(request.config).future.result(timeout=300).bootstrap


@pytest.fixture(scope="session")
def expired(request: pytest.FixtureRequest) -> Expired:
    """Every scenario, once the broker expired each one's awaited offset."""
    scenarios = _start(request.config).future.result(timeout=300)
    for s in (scenarios.recovered, scenarios.last_round, scenarios.replayed):
        _wait_until_expired(scenarios.bootstrap, channel.sink_group(s.name), s.topic, 0)
    idle = scenarios.idle
    _wait_until_expired(scenarios.bootstrap, canary_group(idle.name), idle.topic, 0)
    return scenarios
