"""One micro-batch that holds a backlog (issue 48 items 1-2), through the real app: its tasks deliver
it in steps, the commit rounds commit the tables while the batch still runs, and a SIGKILL of the
whole app mid-batch, after steps committed, then a restart deliver every record exactly once.

Each step is held 1 s after its transaction (``worker.after-commit=sleep:1``), so that the batch of
a few thousand records lasts several commit intervals (2 s) on any machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import yaml
from chaos.app_process import child_env
from support.sink_factory import SinkFactory, SinkUnderTest

pytestmark = pytest.mark.usefixtures("own_spark")

RECORDS = 12_000
ROUND_COMMITTED = re.compile(r"commit \S+ \((interval|batch-complete)\): .* committed")


def _backlog_sink(sink_factory: SinkFactory) -> SinkUnderTest:
    """The shop sink with a 2 s commit interval and chunks of 1,000 records (a first step of 4,000),
    :data:`RECORDS` records waiting before it starts."""
    sink = sink_factory(commit_interval="2s")
    config = yaml.safe_load(sink.config_file.read_text())
    config["spark"]["max-records-per-batch"] = 1000
    sink.config_file.write_text(yaml.safe_dump(config))
    sink.produce(RECORDS)
    return sink


def test_tables_are_committed_while_one_backlog_batch_runs_and_a_kill_mid_batch_loses_nothing(
    sink_factory: SinkFactory,
) -> None:
    sink = _backlog_sink(sink_factory)
    app = subprocess.Popen(
        sink.command("--trigger-interval", "1s"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=child_env({"FANOUT_SINK_FAULTS": "worker.after-commit=sleep:1"}), start_new_session=True,
    )  # fmt: skip
    assert app.stderr is not None
    seen, rounds = "", 0
    deadline = time.monotonic() + 300
    while rounds < 2 and time.monotonic() < deadline and app.poll() is None:
        line = app.stderr.readline()
        seen += line
        assert "batch 0:" not in line, f"batch 0 ended before two rounds committed its steps:\n{seen[-3000:]}"
        rounds += bool(ROUND_COMMITTED.search(line))
    assert rounds == 2, seen[-3000:]
    os.killpg(app.pid, signal.SIGKILL)  # the driver, its JVM and every Python worker, mid-batch
    app.wait(30)
    got = sink.table_ids()
    assert 0 < sum(len(ids) for ids in got.values()) < sum(len(ids) for ids in sink.expected.values())

    sink.run("--available-now")
    sink.assert_exact()


def test_a_stop_during_a_backlog_batch_cancels_it_after_the_grace_and_the_restart_delivers_the_rest(
    sink_factory: SinkFactory,
) -> None:
    """SIGTERM once steps committed: the stop waits about one step (1 s here) for the batch, then
    cancels its job; the batch is not marked done, the app exits 0 after its final round, and the
    restart replays the batch, skipping the steps committed."""
    sink = _backlog_sink(sink_factory)
    app = subprocess.Popen(
        sink.command("--trigger-interval", "1s"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=child_env({"FANOUT_SINK_FAULTS": "worker.after-commit=sleep:1"}),
    )  # fmt: skip
    assert app.stderr is not None
    seen = ""
    deadline = time.monotonic() + 300
    while not ROUND_COMMITTED.search(seen) and time.monotonic() < deadline and app.poll() is None:
        seen += app.stderr.readline()
    assert ROUND_COMMITTED.search(seen), seen[-3000:]
    app.send_signal(signal.SIGTERM)
    _, rest = app.communicate(timeout=180)
    assert app.returncode == 0, rest[-3000:]
    assert "batch 0:" not in seen + rest, "the stop waited for the whole backlog batch"
    assert "cancelled it" in rest and "final commit round" in rest, rest[-3000:]

    sink.run("--available-now")
    sink.assert_exact()
