"""The Spark app end to end on the real broker and catalog: exact id sets per table after kills."""

from __future__ import annotations

import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaos.app_process import child_env
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyiceberg.exceptions import NoSuchTableError
from support.common import create_named_topic, register_spark_catalog
from support.sink_factory import SinkFactory, SinkUnderTest, new_sink

from fanout_sink.protocol import events
from fanout_sink.protocol.partition_groups import PartitionGroups

pytestmark = pytest.mark.usefixtures("own_spark")


@pytest.fixture
def sink_run(sink_factory: SinkFactory) -> SinkUnderTest:
    return sink_factory()


@dataclass(frozen=True)
class DeliveredRun:
    """A sink after one ``--available-now`` run delivered every record produced before it."""

    sink: SinkUnderTest
    log: str
    profiles: Path


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory, bootstrap_servers: str) -> DeliveredRun:
    """1500 shop events delivered by one run capped at 800 records per micro-batch, at DEBUG, every
    task profiled. One app run (a Spark start) for the tests that look at a delivered run and do not
    change it: the run's own log, tables and profiles, and its checkpoint copied to another sink."""
    folder = tmp_path_factory.mktemp("delivered")
    sink = new_sink(bootstrap_servers, folder)
    sink.produce(1500)
    profiles = folder / "profiles"
    log = sink.run(
        "--available-now", "--max-offsets-per-trigger", "800", "--log-level", "DEBUG",
        env={"FANOUT_SINK_PROFILE": str(profiles)},
    )  # fmt: skip
    return DeliveredRun(sink, log, profiles)


def test_available_now_into_static_and_dynamic_tables_read_both_ways(
    delivered: DeliveredRun, spark: Any
) -> None:
    sink_run, log, profiles = delivered.sink, delivered.log, delivered.profiles
    assert "batch 0:" in log and "batch 1:" in log, "the cap splits the run into several micro-batches"
    # Every task ran under cProfile: one dump per topic-partition and batch, loadable by pstats.
    dumps = sorted(p.name for p in profiles.iterdir())
    assert {name.rsplit("-", 1)[1] for name in dumps} == {"0.prof", "1.prof"}, dumps
    assert pstats.Stats(str(profiles / dumps[0])).total_calls > 0
    assert "spark progress: batch 1, durations ms" in log, "Spark's own progress is logged too, at DEBUG"
    batch_lines = re.findall(r"batch \d+: (\d+) records in, .* MB\), (\d+) records/s", log)
    assert sum(int(n) for n, _rate in batch_lines) == 1500, f"the tasks' own counts and rates: {log[-3000:]}"
    sink_run.assert_exact()

    # A second run with nothing new delivers nothing twice.
    sink_run.run("--available-now")
    sink_run.assert_exact()

    orders = f"{register_spark_catalog(spark, sink_run.settings)}.shop.orders"
    spark_ids = {row.id for row in spark.sql(f"SELECT id FROM {orders}").collect()}
    assert spark_ids == sink_run.expected["shop.orders"]
    summaries = spark.sql(f"SELECT summary FROM {orders}.snapshots ORDER BY committed_at").collect()
    assert summaries, "the sink committed at least one snapshot"
    prefix = f"fanout-sink.{sink_run.name}."
    last = summaries[-1].summary
    assert {key for key in last if key.startswith(prefix)} >= {
        f"{prefix}commit-id",
        f"{prefix}control-offsets",
    }


def test_driver_killed_mid_run_then_restarted(sink_run: SinkUnderTest) -> None:
    sink_run.produce(1600)  # four batches of 400: the kill lands in batch 2, or 3 on a fast machine
    env = child_env({"FANOUT_SINK_FAULTS": "worker.after-commit=sleep:1"})
    app = subprocess.Popen(
        sink_run.command("--trigger-interval", "1s", "--max-offsets-per-trigger", "400"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    assert app.stderr is not None
    seen = ""
    deadline = time.monotonic() + 300
    while "batch 1:" not in seen and time.monotonic() < deadline and app.poll() is None:
        seen += app.stderr.readline()
    assert "batch 1:" in seen, seen[-3000:]
    time.sleep(2.5)  # each slice sleeps 1s after its transaction: the kill lands inside batch 2
    os.killpg(app.pid, signal.SIGKILL)  # the driver, its JVM and every Python worker at once
    app.wait(30)

    sink_run.produce(100)  # the world goes on while the sink is down
    sink_run.run("--available-now")
    sink_run.assert_exact()


def test_executor_python_worker_killed_mid_batch_in_local_cluster(
    sink_run: SinkUnderTest, tmp_path: Path
) -> None:
    sink_run.produce(900)
    marker = tmp_path / "worker-killed"
    sink_run.run(
        "--available-now",
        "--master", "local-cluster[2,1,1024]",
        "--conf", f"spark.executorEnv.FANOUT_SINK_FAULTS=worker.after-write-files=kill-once:{marker}",
        "--conf", "spark.task.maxFailures=4",
    )  # fmt: skip
    assert marker.exists(), "a Python worker was killed after writing its files, before its transaction"
    sink_run.assert_exact()


def test_executor_python_worker_killed_holding_two_groups_on_threads_in_local_cluster(
    sink_run: SinkUnderTest, tmp_path: Path
) -> None:
    """``spark.groups-per-task: 2`` on two executors of one core: a batch's two partition groups go
    to one task, one Python worker, one thread each. Each thread holds its group's transaction open
    at ``worker.before-commit`` (events and offsets sent) while the first to get there sleeps, then
    kills the process: both groups' transactions are left open (then aborted by the retry's fencing:
    seen as DataComplete events read uncommitted that a committed read does not see), and every row
    lands once."""
    settings = yaml.safe_load(sink_run.config_file.read_text())
    settings["spark"]["groups-per-task"] = 2
    sink_run.config_file.write_text(yaml.safe_dump(settings))
    sink_run.produce(900)
    marker = tmp_path / "worker-killed"
    faults = f"worker.before-commit=sleep:8,worker.before-commit=kill-once:{marker}"
    sink_run.run(
        "--available-now",
        "--master", "local-cluster[2,1,1024]",
        "--conf", f"spark.executorEnv.FANOUT_SINK_FAULTS={faults}",
        "--conf", "spark.task.maxFailures=4",
    )  # fmt: skip
    assert marker.exists(), "a Python worker was killed inside its groups' transactions"
    groups = PartitionGroups(2)
    aborted = Counter(
        groups.group_of(topic, partition)
        for (topic, partition), count in (
            _data_completes(sink_run, "read_uncommitted") - _data_completes(sink_run, "read_committed")
        ).items()
        for _ in range(count)
    )
    assert set(aborted) == {0, 1}, f"each group's transaction was open at the kill: {aborted}"
    sink_run.assert_exact()


def _data_completes(sink_run: SinkUnderTest, isolation: str) -> Counter[tuple[str, int]]:
    """The control topic's ``DataComplete`` events per source partition, read with ``isolation``."""
    consumer = Consumer(
        {
            "bootstrap.servers": sink_run.bootstrap,
            "group.id": f"count-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    found: Counter[tuple[str, int]] = Counter()
    try:
        consumer.assign([TopicPartition(sink_run.control_topic, 0, OFFSET_BEGINNING)])
        while (message := consumer.poll(10)) is not None and message.error() is None:
            payload = events.decode(message.value()).payload
            if isinstance(payload, events.DataComplete):
                found[(payload.topic, payload.partition)] += 1
    finally:
        consumer.close()
    return found


def _start_streaming(sink_run: SinkUnderTest) -> subprocess.Popen[str]:
    app = subprocess.Popen(
        sink_run.command("--trigger-interval", "1s"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    return app


def _read_until(app: subprocess.Popen[str], marker: str, timeout_s: float = 300) -> str:
    assert app.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout_s
    while marker not in seen and time.monotonic() < deadline and app.poll() is None:
        seen += app.stderr.readline()
    assert marker in seen, seen[-3000:]
    return seen


def test_a_finished_batch_commits_at_once_and_a_topic_created_while_running_lands_without_a_restart(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """One streaming run over ``source.pattern`` (a database's topics), with a commit interval far
    beyond the test: only a round started by a batch's completion can fill the tables while the app
    runs. Then a table added to the database while the sink runs gets a topic of its own, which
    Spark's Kafka source finds when it plans a batch; its records land beside the others', once, with
    no restart. (One run for both: each cost an app start of its own.)"""
    prefix = f"db{uuid.uuid4().hex[:8]}"
    orders = create_named_topic(bootstrap_servers, f"{prefix}.orders", 3)
    sink_run = sink_factory(
        topics={"orders": orders},
        commit_interval="1h",
        overrides={"source": {"format": "json", "pattern": re.escape(prefix) + r"\..+"}},
    )
    sink_run.produce(300, roles={"orders"})
    app = _start_streaming(sink_run)
    try:
        _read_until(app, "batch 0:")
        visible = _holds_expected_within(sink_run, 120)
        sink_run.topics["clicks"] = create_named_topic(bootstrap_servers, f"{prefix}.clicks", 2)
        sink_run.produce(300)
        assert sink_run.expected["shop.clicks"], "the new topic got records"
        landed = _holds_expected_within(sink_run, 180)
    finally:
        app.send_signal(signal.SIGTERM)
        _, rest = app.communicate(timeout=180)
    assert app.returncode == 0, rest[-3000:]
    assert visible, "the batch's rows were not in the tables while the app ran: the commit waited"
    assert "(batch-complete)" in rest, rest[-3000:]
    assert landed, "the new topic's records did not land while the app ran"
    sink_run.assert_exact()


def _holds_expected_within(sink_run: SinkUnderTest, seconds: float) -> bool:
    """Whether the tables come to hold their expected ids within ``seconds`` (a bound for a loaded
    machine, not a measured time), looking once a second while the app runs."""
    deadline = time.monotonic() + seconds
    while not (held := _holds_expected(sink_run)) and time.monotonic() < deadline:
        time.sleep(1)
    return held


def _holds_expected(sink_run: SinkUnderTest) -> bool:
    """Whether every expected table holds (at least) its expected ids; False while one is missing."""
    try:
        got = sink_run.table_ids()
    except NoSuchTableError:
        return False
    return all(ids <= set(got[table]) for table, ids in sink_run.expected.items())


def test_sigterm_finishes_the_batch_commits_and_exits_zero(sink_factory: SinkFactory) -> None:
    """With a commit interval and a minimum between rounds far beyond the test, the tables can only be
    filled by the stop's commit."""
    sink_run = sink_factory(commit_interval="1h", commit_min_interval="1h")
    sink_run.produce(200)
    app = _start_streaming(sink_run)
    _read_until(app, "batch 0:")
    app.send_signal(signal.SIGTERM)
    _, rest = app.communicate(timeout=180)
    assert app.returncode == 0, rest[-3000:]
    assert "stop requested" in rest and "final commit round" in rest
    sink_run.assert_exact()


def test_checkpoint_ahead_of_the_sink_group_is_moved_aside(
    tmp_path: Path, sink_factory: SinkFactory, delivered: DeliveredRun
) -> None:
    """A checkpoint that claims more than the sink group delivered (here: copied from another sink)
    must not make the sink skip records: the group wins, and the operator is told."""
    first = delivered.sink
    second = sink_factory(folder=tmp_path / "b", topics=first.topics)
    second.expected = first.expected
    shutil.copytree(first.checkpoint, tmp_path / "b" / "checkpoints" / second.name)
    log = second.run("--available-now")
    assert "ahead of the sink-managed group" in log
    second.assert_exact()
    assert list((tmp_path / "b" / "checkpoints").glob(f"{second.name}.stale-*")), "the old checkpoint is kept"


def test_spark_submit_runs_the_same_app(sink_run: SinkUnderTest) -> None:
    """The cluster entry point: spark-submit owns the master and the jars, the app does the rest. The
    driver JVM gets the planning options docs/production.md gives the submit command (C1 only, the
    serial collector): spark-submit starts it, so the app cannot."""
    import fanout_sink.submit
    from fanout_sink import jars
    from fanout_sink.spark.jvm import DriverJvm, driver_java_options
    from fanout_sink.spark.session import SPARK_CONNECTORS

    sink_run.produce(100)
    connector_jars = ",".join(str(path) for path in jars.jars(SPARK_CONNECTORS))
    submit = Path(sys.executable).parent / "spark-submit"
    java_options = driver_java_options(DriverJvm(None, dumping=False), light_jit=True, user_options=None)
    result = subprocess.run(
        [str(submit), "--master", "local[2]", "--jars", connector_jars,
         "--driver-memory", "512m", "--driver-java-options", java_options, fanout_sink.submit.__file__,
         "--config", str(sink_run.config_file), "--available-now"],
        capture_output=True, text=True, timeout=420, check=False,
        env=child_env({"PYSPARK_PYTHON": sys.executable}),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    # spark-submit's Python runner merges the app's stderr into its stdout.
    assert "fanout_sink.app: batch 0:" in result.stdout + result.stderr, "the sink's log shows there too"
    sink_run.assert_exact()
