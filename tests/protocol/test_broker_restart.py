"""A broker killed (SIGKILL) and restarted while a worker's transaction is open: exact rows afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support.common import create_tables, make_processor, produce_json, run_batch, table_ids

from fanout_sink import faults
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker

pytestmark = pytest.mark.kafka


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

    worker = SliceWorker(sink, conf, f"{sink}-control", timeout_s=60)
    outcome = "completed"
    with faults.register("worker.before-commit", crash_broker):
        try:
            run_batch(worker, bootstrap, {topic: 2}, make_processor(catalog))
        except Exception as exc:  # the transaction may abort or complete; either way the retry decides
            outcome = repr(exc)
    print(f"batch across the broker crash: {outcome}")
    worker.close()
    retry = SliceWorker(sink, conf, f"{sink}-control", timeout_s=60)
    run_batch(retry, bootstrap, {topic: 2}, make_processor(catalog))
    retry.close()
    coordinator = Coordinator(sink, conf, f"{sink}-control", catalog, source_topics=[topic], timeout_s=60)
    coordinator.open()
    coordinator.commit_round()
    coordinator.close()
    assert crashed
    assert table_ids(catalog, "a") == sorted(expected["a"])
    assert table_ids(catalog, "b") == sorted(expected["b"])
