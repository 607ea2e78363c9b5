"""Start-up failures end quickly with one line naming the cause and one naming the fix, never a hang."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.broker_watch import death_report

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import KAFKA_BROKER, KafkaBroker
from fanout_sink.errors import StackError


def _path_without(tool: str, tmp_path: Path) -> str:
    """A PATH on which every directory's executables are linked except ``tool``."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.listdir(directory):
            target = shadow / entry
            if entry != tool and not target.exists() and os.access(os.path.join(directory, entry), os.X_OK):
                target.symlink_to(os.path.join(directory, entry))
    return str(shadow)


def test_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_without("java", tmp_path))
    with pytest.raises(StackError) as excinfo:
        KafkaBroker(tmp_path / "broker").start()
    assert "`java` was not found" in excinfo.value.cause
    assert "JDK 17" in excinfo.value.fix


def test_missing_mvn_with_nothing_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FANOUT_SINK_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", _path_without("mvn", tmp_path))
    with pytest.raises(StackError) as excinfo:
        jars.fetch(KAFKA_BROKER)
    assert "`mvn` was not found" in excinfo.value.cause
    assert "apt-get install -y maven" in excinfo.value.fix


def test_maven_unreachable_ends_with_a_cause_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every repository is mirrored to a closed port on loopback, with an empty local repository."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    settings = tmp_path / "settings.xml"
    settings.write_text(
        f"""<settings><localRepository>{tmp_path / "m2"}</localRepository>
  <mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>
  <url>http://127.0.0.1:{closed_port}/maven2</url></mirror></mirrors></settings>"""
    )
    monkeypatch.setenv("FANOUT_SINK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FANOUT_SINK_MAVEN_SETTINGS", str(settings))
    started = time.monotonic()
    with pytest.raises(StackError) as excinfo:
        jars.fetch(KAFKA_BROKER, timeout_s=240)
    assert time.monotonic() - started < 240
    assert "could not fetch the kafka-broker jars" in excinfo.value.cause
    assert "Maven Central looks unreachable" in excinfo.value.fix
    assert not jars.jar_dir(KAFKA_BROKER).exists(), "a failed fetch leaves no half-filled cache"


def test_taken_port_is_refused_before_starting(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StackError) as excinfo:
            KafkaBroker(tmp_path / "broker", port=port).start()
    assert f"port {port} on 127.0.0.1 is already taken" in excinfo.value.cause
    assert "ss -ltnp" in excinfo.value.fix


@pytest.mark.usefixtures("own_broker")  # its JVM starts, then dies
def test_broker_that_dies_on_start_reports_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FANOUT_SINK_BROKER_HEAP", "not-a-size")  # the JVM refuses to start with it
    broker = KafkaBroker(tmp_path / "broker")
    started = time.monotonic()
    with pytest.raises(StackError) as excinfo:
        broker.start(timeout_s=60)
    assert time.monotonic() - started < 60
    assert "exit code" in excinfo.value.cause
    assert "Invalid maximum heap size" in excinfo.value.details
    assert str(broker.log_file) in excinfo.value.details


def test_a_broker_killed_from_outside_is_reported_with_its_signal_and_log(
    broker_factory: Callable[[], KafkaBroker],
) -> None:
    """What a lane's tests say when their shared broker dies under them (as the kernel's OOM killer
    would kill it): the signal and the log's end, once, instead of a time-out in every later test."""
    broker = broker_factory()
    assert broker.exit_code() is None
    assert broker.state is not None
    os.kill(broker.state.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while broker.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.exit_code() == -signal.SIGKILL
    report = death_report(broker, -signal.SIGKILL)
    assert "killed by signal 9" in report
    assert str(broker.log_file) in report
    assert broker.log_file.read_text().splitlines()[-1] in report
