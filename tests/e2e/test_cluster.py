"""The issue's acceptance test: the app on a Spark standalone cluster (a master and 2 worker JVMs,
executors as real remote processes running the packed environment), with an executor JVM SIGKILLed
mid-batch and a worker SIGKILLed (and restarted) mid-run, then the exact ids of every table read
through PyIceberg and through Spark SQL: nothing lost, nothing twice."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from chaos import kills, scenario
from chaos.app_process import AppProcess, child_env
from chaos.traffic import Traffic
from chaos.verify import verify

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.spark_cluster import SparkCluster, cmdline, master_status
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol.channel import sink_group
from fanout_sink.spark.shipping import EXECUTOR_PYTHON

ROOT = Path(__file__).resolve().parents[2]
BEFORE = 1000  # records produced before the app starts
DURING = 8000  # at most, while it runs: the traffic ends once a batch ran after both kills
RATE = 250.0  # records/s while it runs: every batch has records, and the kills find one in flight


def _kill_executor_mid_batch(cluster: SparkCluster, timeout_s: float = 120.0) -> tuple[int, list[str]]:
    """SIGKILL an executor JVM while one of its Python workers keeps burning CPU (a task mid-slice,
    not the tail of the last one: busy in 3 samples in a row); its pid and its Python workers'
    command lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for executor in cluster.executor_pids():
            workers = kills.python_workers(executor)
            busy = 0
            for _ in range(3):
                before = {pid: kills.cpu_ticks(pid) for pid in workers}
                time.sleep(0.2)
                busy += any(kills.cpu_ticks(pid) > ticks for pid, ticks in before.items())
            if busy == 3:
                commands = [cmdline(pid) for pid in workers]
                os.kill(executor, signal.SIGKILL)
                return executor, commands
    raise AssertionError(f"no executor ran a Python task within {timeout_s:.0f}s")


def _wait_drained(bootstrap: str, sink: str, topics: list[str], app: AppProcess, timeout_s: float) -> None:
    """Until the sink group (committed with each batch's files) reaches the end of every partition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        positions = source_positions(
            KafkaClientFactory({"bootstrap.servers": bootstrap}), sink_group(sink), topics
        )
        if positions and all(p.committed == p.end for p in positions):
            return
        assert app.running(), f"the app exited:\n{app.log_tail()}"
        time.sleep(1)
    raise AssertionError(f"the sink group did not reach the topics' ends in {timeout_s:.0f}s: {positions}")


def _spark_sql_ids(settings: CatalogSettings, tables: list[str]) -> dict[str, Counter[str]]:
    """Each table's ids through Spark SQL, in a session of its own with the catalog's jars
    (``support/spark_s3_child.py``: the suite's shared session lacks the object-store jars), read by
    one statement: one Spark job for every table, not one each."""
    script = ROOT / "tests" / "support" / "spark_s3_child.py"
    sql = " UNION ALL ".join(f"SELECT '{table}', id FROM {settings.name}.{table}" for table in tables)
    payload = json.dumps({"catalog": settings.model_dump_json(), "sql": [sql]})
    result = subprocess.run(
        [sys.executable, str(script), payload], capture_output=True, text=True, timeout=300,
        env=child_env({"PYTHONPATH": str(ROOT)}), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [rows] = json.loads(result.stdout.strip().splitlines()[-1])["sql"]
    ids: dict[str, Counter[str]] = {table: Counter() for table in tables}
    for table, rid in rows:
        ids[table][rid] += 1
    return ids


def _count(log_text: str, marker: str) -> int:
    return sum(1 for line in log_text.splitlines() if marker in line)


def run_on_cluster(
    cluster: SparkCluster,
    bootstrap: str,
    make_topic: Callable[..., str],
    settings: CatalogSettings,
    work_dir: Path,
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
        during.close()  # the app ran a batch after both kills: more records prove nothing more
        cluster.revive()
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
    # The verdict found every table's ids through PyIceberg equal to what the topics route to it, and
    # no other table: Spark SQL must read the same, without a second PyIceberg scan of every file.
    expected = verdict.tables
    through_spark = _spark_sql_ids(settings, sorted(expected))
    for table, ids in expected.items():
        assert through_spark[table] == ids, table
    rows = {table: ids.total() for table, ids in sorted(expected.items())}
    log_text = app.log_file.read_text(errors="replace")
    print(
        f"\ncluster e2e [{settings.type}, checkpoint {config['spark']['checkpoint-location']}]: "
        f"records={verdict.records} rows={verdict.rows} per table={rows} "
        f"dead-lettered={verdict.dead_lettered} kills: executor pid {executor} mid-batch, "
        f"worker pid {worker} "
        f"(restarted) lost executors={_count(log_text, 'Lost executor')} "
        f"lost tasks={_count(log_text, 'Lost task')} batches={app.batches} "
        f"seconds={time.monotonic() - started:.0f}"
    )


@pytest.mark.timeout(900)
def test_on_the_rest_catalog_and_s3_with_an_s3a_checkpoint_no_id_is_lost_or_doubled_through_kills(
    spark_cluster: SparkCluster,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    rest_s3_catalog_settings: CatalogSettings,
    s3_prefix: str,
    tmp_path: Path,
) -> None:
    checkpoint = s3_prefix.replace("s3://", "s3a://", 1) + "/checkpoints"
    run_on_cluster(
        spark_cluster, bootstrap_servers, make_topic, rest_s3_catalog_settings, tmp_path, checkpoint
    )


def documented_submit_command() -> str:
    """The ``spark-submit`` block of docs/production.md, as written: the fenced block after the
    comment that names the test running it."""
    text = (ROOT / "docs" / "production.md").read_text()
    marker = text.index("<!-- run verbatim by tests/e2e/test_cluster.py::")
    block = text[text.index("```bash\n", marker) + len("```bash\n") :]
    return block[: block.index("```")]


@pytest.mark.timeout(900)
def test_the_documented_spark_submit_command_runs_the_app_on_the_cluster_verbatim(
    spark_cluster: SparkCluster,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    postgres_s3_catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """docs/production.md's command run by ``bash`` from the folder of ``sink.yaml``, with only its
    variable set and the virtualenv first on ``PATH`` (``python``, ``fanout-sink``, ``spark-submit``),
    on the PostgreSQL catalog with an S3 warehouse (the object-store jars of its ``--jars`` line) and
    ``spark.available-now`` so that it ends; then the same command in cluster deploy mode, which Spark
    refuses for Python on a standalone master, as the doc says. (The kills run once, in the REST
    variant above: what they test does not depend on the catalog's server, and each costs minutes.)"""
    catalog_settings = postgres_s3_catalog_settings
    name = f"submit{uuid.uuid4().hex[:6]}"
    topics = [make_topic(f"{name}-a", partitions=2)]
    config = scenario.sink_config(name, bootstrap_servers, topics, catalog_settings, tmp_path)
    config["spark"]["available-now"] = True
    (tmp_path / "sink.yaml").write_text(yaml.safe_dump(config))
    traffic = Traffic(bootstrap_servers, topics, 600, seed=3, rate=1e5)
    traffic.start()
    traffic.finish(120)
    script = documented_submit_command()
    bin_dir = str(Path(sys.executable).parent)
    env = child_env(
        {
            "PYTHONPATH": str(ROOT),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_MASTER": spark_cluster.master_url,
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        }
    )
    app = AppProcess(
        ["bash", "-euo", "pipefail", "-c", f"cd {shlex.quote(str(tmp_path))} && {script}"],
        tmp_path / "submit.log",
        env,
    )
    app.start()
    try:
        assert app.wait_exit(600) == 0, app.log_tail()
    finally:
        if app.running():
            app.kill_group()

    status = master_status(spark_cluster.master_state.webui_port)
    ran = [app["name"] for app in status["activeapps"] + status["completedapps"]]
    assert name in ran, f"the app did not run on the cluster (the config's local master won?): {ran}"
    verdict = verify(bootstrap_servers, topics, f"{name}-dlq", name, load_catalog(catalog_settings))
    assert verdict.ok, "\n".join(verdict.problems)
    assert verdict.rows > 0

    cluster_mode = script.replace(
        'spark-submit --master "$SPARK_MASTER"', 'spark-submit --deploy-mode cluster --master "$SPARK_MASTER"'
    )
    assert cluster_mode != script
    refused = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"cd {shlex.quote(str(tmp_path))} && {cluster_mode}"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "Cluster deploy mode is currently not supported for python applications" in refused.stderr
