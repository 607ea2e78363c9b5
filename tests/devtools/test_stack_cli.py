"""``fanout-sink stack up | status | down`` for people, run as the real command in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.kafka

CLI = [sys.executable, "-m", "fanout_sink.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, check=False)


def test_stack_up_status_down_round_trip(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "stack")
    try:
        first = _cli("stack", "up", "--dir", state_dir, "--json")
        assert first.returncode == 0, first.stderr
        up = json.loads(first.stdout)
        assert up["started"] is True and up["bootstrap.servers"].startswith("127.0.0.1:")

        again = _cli("stack", "up", "--dir", state_dir)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == f"bootstrap.servers={up['bootstrap.servers']}"
        assert "already running" in again.stderr

        status = _cli("stack", "status", "--dir", state_dir, "--json")
        assert status.returncode == 0
        report = json.loads(status.stdout)
        assert report["running"] is True and report["pid"] == up["pid"]
        metadata = AdminClient({"bootstrap.servers": up["bootstrap.servers"]}).list_topics(timeout=30)
        assert metadata.brokers, "the broker answers metadata requests"
    finally:
        down = _cli("stack", "down", "--dir", state_dir)
    assert down.returncode == 0
    after = _cli("stack", "status", "--dir", state_dir, "--json")
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False


def test_status_of_a_stack_never_started(tmp_path: Path) -> None:
    result = _cli("stack", "status", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 1
    assert "fanout-sink stack up" in result.stdout
