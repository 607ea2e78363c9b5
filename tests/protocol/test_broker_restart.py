"""A broker killed (SIGKILL) and restarted while a worker's transaction is open: exact rows afterwards."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from support.common import create_tables, make_processor, produce_json, run_batch, table_ids

from fanout_sink import faults
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker


def test_broker_killed_mid_transaction_then_retry_delivers_exactly_once(
    broker_factory: Callable[[], KafkaBroker], catalog: Any
) -> None:
    broker = broker_factory()
    bootstrap = broker.bootstrap_servers
    conf = {"bootstrap.servers": bootstrap}
    topic = f"src-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    create_tables(catalog, ["a", "b"])
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(2):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10)]
        produce_json(bootstrap, topic, partition, values)
        for v in values:
            expected[str(v["table"])].append(int(str(v["id"])))
    sink = f"r{uuid.uuid4().hex[:6]}"
    crashed: list[bool] = []

    def crash_broker(**_: object) -> None:
        if not crashed:
            crashed.append(True)
            broker.kill()
            broker.restart()

    worker = SliceWorker(SinkChannel(sink, conf, f"{sink}-control", timeout_s=60))
    outcome = "completed"
    with faults.register("worker.before-commit", crash_broker):
        try:
            run_batch(worker, bootstrap, {topic: 2}, make_processor(catalog))
        except Exception as exc:  # the transaction may abort or complete; either way the retry decides
            outcome = repr(exc)
    print(f"batch across the broker crash: {outcome}")
    worker.close()
    retry = SliceWorker(SinkChannel(sink, conf, f"{sink}-control", timeout_s=60))
    run_batch(retry, bootstrap, {topic: 2}, make_processor(catalog))
    retry.close()
    coordinator = Coordinator(
        SinkChannel(sink, conf, f"{sink}-control", timeout_s=60), catalog, source_topics=[topic]
    )
    coordinator.open()
    coordinator.commit_round()
    coordinator.close()
    assert crashed
    assert table_ids(catalog, "a") == sorted(expected["a"])
    assert table_ids(catalog, "b") == sorted(expected["b"])


def test_the_coordinator_thread_outlives_a_broker_outage_longer_than_its_timeouts(
    broker_factory: Callable[[], KafkaBroker], catalog: Any
) -> None:
    """The broker stays away for several times the coordinator's Kafka timeout: the rounds fail, and so
    does re-creating its transactional producer (``init_transactions`` times out while polling). The
    thread keeps trying; once the broker is back, the next rounds commit everything, exactly once."""
    broker = broker_factory()
    bootstrap = broker.bootstrap_servers
    conf = {"bootstrap.servers": bootstrap}
    topic = f"src-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(conf)  # kept: a client collected before its future resolves cancels it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    create_tables(catalog, ["a", "b"])
    sink = f"o{uuid.uuid4().hex[:6]}"
    first = [{"id": i, "table": "ab"[i % 2]} for i in range(10)]
    produce_json(bootstrap, topic, 0, first)
    worker = SliceWorker(SinkChannel(sink, conf, f"{sink}-control", timeout_s=60))
    run_batch(worker, bootstrap, {topic: 1}, make_processor(catalog))
    worker.close()
    coordinator = Coordinator(
        SinkChannel(sink, conf, f"{sink}-control", timeout_s=4.0), catalog, source_topics=[topic],
        commit_interval_s=1.0, commit_timeout_s=10.0,
    )  # fmt: skip
    coordinator.start()
    try:
        _wait_for(lambda: len(table_ids(catalog, "a")) + len(table_ids(catalog, "b")) == 10, 60)
        broker.restart(away_s=12.0)  # three times the producer's timeout: rounds and re-inits fail
        assert coordinator.error is None, f"the coordinator stopped: {coordinator.error!r}"
        second = [{"id": 100 + i, "table": "ab"[i % 2]} for i in range(10)]
        produce_json(bootstrap, topic, 0, second)
        worker = SliceWorker(SinkChannel(sink, conf, f"{sink}-control", timeout_s=60))
        run_batch(worker, bootstrap, {topic: 1}, make_processor(catalog))
        worker.close()
        expected = {t: sorted(int(str(v["id"])) for v in first + second if v["table"] == t) for t in "ab"}
        _wait_for(lambda: {t: table_ids(catalog, t) for t in "ab"} == expected, 120)
        assert coordinator.error is None
    finally:
        coordinator.stop(commit_now=False)
        coordinator.close()


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout_s:.0f} s"
        time.sleep(0.5)
