"""The app's PySpark daemon (spark/worker_daemon.py) started the way Spark starts one: it has the
task's imports loaded before it forks any worker, and runs PySpark's own daemon protocol."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path


def _daemon(module: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module, "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def _maps_after_start(daemon: subprocess.Popen[bytes]) -> str:
    """The daemon's memory map once it listens (it writes its port first, as Spark reads it)."""
    assert daemon.stdout is not None and daemon.stdin is not None
    (port,) = struct.unpack(">i", daemon.stdout.read(4))
    assert port > 0
    maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    daemon.stdin.close()  # Spark's way of stopping it; PySpark's daemon then exits with status 1
    daemon.wait(timeout=60)
    return maps


def test_the_daemon_has_the_tasks_imports_before_it_forks_and_stops_when_spark_closes_its_stdin() -> None:
    # librdkafka is loaded by confluent_kafka, which only the sink's task imports.
    assert "librdkafka" in _maps_after_start(_daemon("fanout_sink.spark.worker_daemon"))
    assert "librdkafka" not in _maps_after_start(_daemon("pyspark.daemon"))
