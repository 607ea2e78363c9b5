"""librdkafka's own lines go to Python logging at DEBUG; an unreachable cluster is one WARNING, its
return one INFO, whatever the number of clients and reconnect attempts."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.clients import client_conf

_UNREACHABLE = """
import sys, time
from confluent_kafka import Consumer, Producer
from fanout_sink import logs
from fanout_sink.kafka.clients import client_conf
logs.configure("plain", sys.argv[1])
conf = client_conf({"bootstrap.servers": "127.0.0.1:1"})
clients = [Producer(conf), Consumer({**conf, "group.id": "g"})]
deadline = time.monotonic() + 6
while time.monotonic() < deadline:
    clients[0].poll(0.2)
    clients[1].poll(0.2)
"""


def _run_unreachable(*levels: str) -> list[list[str]]:
    """Each level's stderr lines; the children run side by side (each tries for 6 s)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _UNREACHABLE, level],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for level in levels
    ]
    outputs = []
    for child in children:
        _out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        outputs.append(err.splitlines())
    return outputs


def test_librdkafka_lines_do_not_reach_stderr_at_info() -> None:
    lines, debug = _run_unreachable("INFO", "DEBUG")
    assert [line for line in lines if "Kafka at 127.0.0.1:1 is unreachable" in line], lines
    assert len(lines) == 1, "two clients, many failed connects: one line"
    assert " WARNING fanout_sink.kafka.clients: " in lines[0]
    # At DEBUG the same lines are there, through Python logging (librdkafka's raw format: %3|...).
    assert any(" DEBUG fanout_sink.librdkafka: FAIL [rdkafka#" in line for line in debug), debug[:5]
    assert not any(line.startswith("%") for line in debug)


def test_one_warning_when_the_broker_goes_away_one_info_when_it_is_back(
    broker_factory: Callable[..., KafkaBroker],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = broker_factory()
    # caplog listens on the root logger; the sink's own handler (if a test configured it) stops there.
    monkeypatch.setattr(logging.getLogger("fanout_sink"), "propagate", True)
    caplog.set_level(logging.INFO, logger="fanout_sink.kafka.clients")
    consumer = Consumer({**client_conf({"bootstrap.servers": broker.bootstrap_servers}), "group.id": "g"})
    try:
        consumer.list_topics(timeout=30)

        def said(text: str) -> list[str]:
            consumer.poll(0.2)  # serves error_cb
            return [r.getMessage() for r in caplog.records if text in r.getMessage()]

        broker.stop()
        _until(lambda: said("is unreachable"), "the WARNING")
        broker.restart()
        _until(lambda: said("is reachable again"), "the INFO")
        assert len(said("is unreachable")) == 1 and len(said("is reachable again")) == 1
        levels = {r.levelname for r in caplog.records if broker.bootstrap_servers in r.getMessage()}
        assert levels == {"WARNING", "INFO"}
    finally:
        consumer.close()


def _until(condition: Callable[[], object], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s"
