"""``fanout-sink stack up | status | down`` for people, run as the real command in a subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy
from confluent_kafka.admin import AdminClient

from fanout_sink.devtools.stack.object_store import ObjectStoreState
from fanout_sink.devtools.stack.service import http_status
from fanout_sink.processes import pid_alive

CLI = [sys.executable, "-m", "fanout_sink.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.usefixtures("own_broker")
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


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_up_with_stores_status_and_down(tmp_path: Path) -> None:
    stack_dir = str(tmp_path / "stack")
    try:
        up = _cli("stack", "up", "--dir", stack_dir, "--with", "s3,postgres", "--json")
        assert up.returncode == 0, up.stderr
        started = json.loads(up.stdout)
        assert started["s3"]["started"] is True and started["postgres"]["started"] is True
        assert "***" in started["postgres"]["uri"], "the password is not printed"

        report = json.loads(_cli("stack", "status", "--dir", stack_dir, "--json").stdout)
        s3, pg = report["services"]["s3"], report["services"]["postgres"]
        assert s3["running"] and pg["running"]
        store = ObjectStoreState(**{k: s3[k] for k in ObjectStoreState.__dataclass_fields__})
        assert store.create_bucket("from-status") == "s3://from-status"
        engine = sqlalchemy.create_engine(
            f"postgresql+psycopg2://{pg['user']}:{pg['password']}@127.0.0.1:{pg['port']}/{pg['database']}"
        )
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("select 1")).scalar() == 1
        engine.dispose()

        text = _cli("stack", "status", "--dir", stack_dir).stdout
        assert f"s3: running  s3.endpoint={store.endpoint}" in text and ":***@" in text
        again = _cli("stack", "up", "--dir", stack_dir, "--with", "s3")
        assert again.returncode == 0 and "S3 object store (S3Proxy) already running" in again.stderr
    finally:
        down = _cli("stack", "down", "--dir", stack_dir)
    assert down.returncode == 0, down.stderr
    after = json.loads(_cli("stack", "status", "--dir", stack_dir, "--json").stdout)
    assert not after["services"]["s3"]["running"] and not after["services"]["postgres"]["running"]


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_serve_runs_in_the_foreground_until_sigterm(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        [*CLI, "stack", "serve", "s3", "--dir", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert serving.stdout is not None
        line = json.loads(serving.stdout.readline())
        assert line["serving"] == "s3" and http_status(f"http://127.0.0.1:{line['port']}/") == 403
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 0
        assert not pid_alive(line["pid"]), "stopping the command stops the server"
    finally:
        serving.kill()


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_serve_rest_without_a_store_says_how_to_give_it_one(tmp_path: Path) -> None:
    result = _cli("stack", "serve", "rest", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "needs an S3 store" in result.stderr and "FANOUT_SINK_S3_ENDPOINT" in result.stderr
