"""The issue's acceptance test: the app on a Spark standalone cluster (a master and 2 worker JVMs,
executors as real remote processes running the packed environment), with an executor JVM SIGKILLed
mid-batch and a worker SIGKILLed (and restarted) mid-run, then the exact ids of every table read
through PyIceberg and through Spark SQL: nothing lost, nothing twice."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fanout_sink.catalog import CatalogSettings, load_catalog, spark_catalog_conf
from fanout_sink.devtools.chaos import kills, scenario
from fanout_sink.devtools.chaos.app_process import AppProcess, child_env
from fanout_sink.devtools.chaos.traffic import Traffic
from fanout_sink.devtools.chaos.verify import verify
from fanout_sink.devtools.stack.spark_cluster import SparkCluster, cmdline
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol.channel import sink_group
from fanout_sink.spark.shipping import EXECUTOR_PYTHON

ROOT = Path(__file__).resolve().parents[2]
BEFORE, DURING = 4000, 8000  # records produced before the app starts, and while it runs
RATE = 250.0  # records/s while it runs: about 30 s of traffic, across both kills


def _kill_executor_mid_batch(cluster: SparkCluster, timeout_s: float = 120.0) -> tuple[int, list[str]]:
    """SIGKILL an executor JVM while one of its Python workers burns CPU (a task mid-slice); its pid
    and the command lines of its Python workers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for executor in cluster.executor_pids():
            workers = kills.python_workers(executor)
            before = {pid: kills.cpu_ticks(pid) for pid in workers}
            time.sleep(0.2)
            if any(kills.cpu_ticks(pid) > ticks for pid, ticks in before.items()):
                commands = [cmdline(pid) for pid in workers]
                os.kill(executor, signal.SIGKILL)
                return executor, commands
    raise AssertionError(f"no executor ran a Python task within {timeout_s:.0f}s")


def _wait_drained(bootstrap: str, sink: str, topics: list[str], app: AppProcess, timeout_s: float) -> None:
    """Until the sink group (committed with each batch's files) reaches the end of every partition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        positions = source_positions({"bootstrap.servers": bootstrap}, sink_group(sink), topics)
        if positions and all(p.committed == p.end for p in positions):
            return
        assert app.running(), f"the app exited:\n{app.log_tail()}"
        time.sleep(1)
    raise AssertionError(f"the sink group did not reach the topics' ends in {timeout_s:.0f}s: {positions}")


def _spark_ids(spark: Any, settings: CatalogSettings, table: str) -> Counter[str]:
    for key, value in spark_catalog_conf(settings).items():
        spark.conf.set(key, value)
    rows = spark.sql(f"SELECT id FROM {settings.name}.{table}").collect()
    return Counter(row.id for row in rows)


def _task_failures(log_text: str) -> int:
    return sum(1 for line in log_text.splitlines() if "Lost task" in line)


def run_on_cluster(
    cluster: SparkCluster,
    bootstrap: str,
    make_topic: Callable[..., str],
    settings: CatalogSettings,
    work_dir: Path,
    spark: Any,
    checkpoint: str | None = None,
) -> None:
    started = time.monotonic()
    name = f"cluster{uuid.uuid4().hex[:6]}"
    topics = [make_topic(f"{name}-a", partitions=6), make_topic(f"{name}-b", partitions=6)]
    config = scenario.sink_config(name, bootstrap, topics, settings, work_dir)
    config["spark"]["master"] = cluster.master_url
    if checkpoint is not None:
        config["spark"]["checkpoint-location"] = checkpoint
    path = work_dir / "sink.yaml"
    path.write_text(yaml.safe_dump(config))
    before = Traffic(bootstrap, topics, BEFORE, seed=1, rate=1e5)
    before.start()
    before.finish(120)
    command = [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(path),
               "--trigger-interval", "2s", "--conf", "spark.executor.memory=1g"]  # fmt: skip
    app = AppProcess(command, work_dir / "app.log", child_env({"PYTHONPATH": str(ROOT)}))
    during = Traffic(bootstrap, topics, DURING, seed=2, rate=RATE)
    producing = False
    try:
        app.start()
        assert app.wait_working(300, batch=True), app.log_tail()
        during.start()
        producing = True
        executor, python_commands = _kill_executor_mid_batch(cluster)
        # The executors import the shipped environment, not the driver's venv or this checkout.
        assert python_commands and all(c.startswith(EXECUTOR_PYTHON) for c in python_commands), (
            python_commands
        )
        assert app.wait_working(180, batch=True), app.log_tail()
        worker = cluster.kill_worker(1)
        assert app.wait_working(180, batch=True), app.log_tail()
        cluster.restart_worker(1)
        during.finish(300)
        _wait_drained(bootstrap, name, topics, app, 300)
        assert app.stop(180) == 0, app.log_tail()
    finally:
        if producing:
            during.stop()
        if app.running():
            app.kill_group()
        cluster.revive()  # the next test gets the whole cluster

    verdict = verify(bootstrap, topics, f"{name}-dlq", name, load_catalog(settings))
    assert verdict.ok, "\n".join(verdict.problems)
    catalog = load_catalog(settings)
    rows = {}
    for table in sorted(
        {t for ns in scenario.NAMESPACES for t in (".".join(i) for i in catalog.list_tables(ns))}
    ):
        pyiceberg_ids = Counter(
            catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        )
        assert _spark_ids(spark, settings, table) == pyiceberg_ids, table
        rows[table] = sum(pyiceberg_ids.values())
    log_text = app.log_file.read_text(errors="replace")
    print(
        f"\ncluster e2e [{settings.type}]: records={verdict.records} rows={verdict.rows} per table={rows} "
        f"dead-lettered={verdict.dead_lettered} kills: executor pid {executor} mid-batch, "
        f"worker pid {worker} "
        f"(restarted) lost tasks seen={_task_failures(log_text)} batches={app.batches} "
        f"seconds={time.monotonic() - started:.0f}"
    )


@pytest.mark.cluster
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_the_app_on_a_cluster_keeps_exact_ids_through_an_executor_and_a_worker_kill(
    spark_cluster: SparkCluster,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog_settings: CatalogSettings,
    tmp_path: Path,
    spark: Any,
) -> None:
    run_on_cluster(spark_cluster, bootstrap_servers, make_topic, catalog_settings, tmp_path, spark)
