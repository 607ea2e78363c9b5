"""The standalone cluster the cluster tests run on: real master and worker JVMs from PySpark's jars."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fanout_sink.devtools.stack.spark_cluster import SparkCluster, load_state, master_status
from fanout_sink.errors import StackError


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_killed_worker_leaves_the_master_and_a_restarted_one_registers_again(
    spark_cluster: SparkCluster,
) -> None:
    state = spark_cluster.state
    assert state is not None and spark_cluster.alive_workers() == 2
    assert master_status(state.webui_port)["url"] == state.master_url
    assert load_state(Path(state.work_dir)) == state

    spark_cluster.kill_worker(1)
    assert _eventually_alive(spark_cluster, 1)

    spark_cluster.restart_worker(1)
    assert spark_cluster.alive_workers() == 2


def _eventually_alive(cluster: SparkCluster, workers: int) -> bool:
    """The master drops a worker when its connection closes; give it the moment it needs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cluster.alive_workers() == workers:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.cluster
def test_a_second_cluster_in_the_same_folder_is_refused_while_the_first_runs(
    spark_cluster: SparkCluster,
) -> None:
    assert spark_cluster.state is not None
    with pytest.raises(StackError, match="already running"):
        SparkCluster(Path(spark_cluster.state.work_dir)).start()
