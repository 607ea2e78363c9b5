"""A Spark standalone cluster (master + 2 workers, each its own JVM) and the executors' packed
environment, built and started once per pytest session; tests that kill a worker restart it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fanout_sink.devtools.stack.spark_cluster import SparkCluster
from fanout_sink.spark import shipping


@pytest.fixture(scope="session")
def executor_pack() -> Path:
    """The pack of this source tree (built on first use, then cached across sessions)."""
    return shipping.build()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """2 workers x 1 core: two executors, so that losing one leaves the app a place to retry.

    The executors' pack is built (or found in the cache) while the JVMs start: the cluster's apps
    need it, the start-up does not, and each takes tens of seconds on a fresh tree."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1536m")
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor-pack") as pool:
            pack = pool.submit(shipping.build)
            cluster.start()
            pack.result()
    except BaseException:
        cluster.kill()  # no JVM outlives a failed set-up
        raise
    yield cluster
    cluster.kill()
    # Every executor unpacks the ~500 MB environment into its own app folder, again after each kill:
    # gigabytes per session that pytest would keep for three sessions.
    for unpacked in _unpacked_environments(cluster.work_dir):
        shutil.rmtree(unpacked, ignore_errors=True)


def _unpacked_environments(root: Path) -> Iterator[Path]:
    """Every unpacked environment under ``root``, found without walking into one: each holds ~15,000
    files, which a plain recursive glob would list only for them to be deleted."""
    for folder, folders, _files in os.walk(root):
        if shipping.ENVIRONMENT in folders:
            folders.remove(shipping.ENVIRONMENT)
            unpacked = Path(folder, shipping.ENVIRONMENT)
            if not unpacked.is_symlink():
                yield unpacked
