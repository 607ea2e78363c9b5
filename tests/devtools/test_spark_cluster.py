"""The standalone cluster the cluster tests run on: real master and worker JVMs from PySpark's jars,
and the same master and worker as ``fanout-sink stack`` servers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fanout_sink.devtools.stack.spark_cluster import SparkCluster, SparkMaster, alive_workers, master_status
from fanout_sink.errors import StackError


@pytest.mark.timeout(300)
def test_a_killed_worker_leaves_the_master_and_a_revived_one_registers_again(
    spark_cluster: SparkCluster,
) -> None:
    state = spark_cluster.master_state
    assert spark_cluster.alive_workers() == 2
    assert master_status(state.webui_port)["url"] == state.master_url
    assert SparkMaster(spark_cluster.master.work_dir).load_state() == state

    spark_cluster.kill_worker(1)  # returns once the master lists one worker
    assert spark_cluster.alive_workers() == 1

    spark_cluster.revive()
    assert spark_cluster.alive_workers() == 2


def test_a_second_master_in_the_same_folder_is_refused_while_the_first_runs(
    spark_cluster: SparkCluster,
) -> None:
    with pytest.raises(StackError, match="already running"):
        SparkMaster(spark_cluster.master.work_dir).start()


def _serve(stack_dir: Path, name: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """``fanout-sink stack serve <name>`` in the foreground, as docker/ runs it; its first line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fanout_sink.cli", "stack", "serve", name, "--dir", str(stack_dir)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"`stack serve {name}` exited with {process.wait(30)}"
    return process, json.loads(line)


@pytest.mark.usefixtures("own_cluster")
@pytest.mark.timeout(300)
def test_stack_serve_runs_a_master_and_a_worker_that_joins_it_and_sigterm_stops_both(tmp_path: Path) -> None:
    master, served = _serve(tmp_path, "spark-master")
    try:
        state = SparkMaster(tmp_path / "spark-master").running()
        assert state is not None and served["pid"] == state.pid
        worker, _ = _serve(tmp_path, "spark-worker")  # finds the master through the stack folder
        try:
            assert len(alive_workers(state.webui_port)) == 1
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(60) == 0
    finally:
        master.send_signal(signal.SIGTERM)
        assert master.wait(60) == 0
    assert SparkMaster(tmp_path / "spark-master").running() is None
