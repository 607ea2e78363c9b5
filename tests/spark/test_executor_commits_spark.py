"""A round's table commits run as a Spark job (``spark/executor_commits.py``) on the suite's local session:
every table once, small rounds on the driver, and what a failed job left committed on the driver."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol.commit_runners import RoundTables, TableCommitRunner, ThreadedCommits
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.table_commit import TableCommit, TableCommitter
from fanout_sink.spark.executor_commits import SparkTableCommits
from fanout_sink.spark.executor_context import TaskSetup


class _Driver:
    """The coordinator's own runner, counting the tables it was handed."""

    def __init__(self, runner: TableCommitRunner) -> None:
        self.runner = runner
        self.tables: list[str] = []

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        self.tables += list(tables.due)
        return self.runner(tables)


def _session(spark: Any) -> Future[Any]:
    """The SparkContext as the app hands it to the runner: once its session exists."""
    context: Future[Any] = Future()
    context.set_result(spark.sparkContext)
    return context


def _coordinator(
    sink: SinkUnderTest, session: Future[Any], min_tables: int, config: SinkConfig | None = None
) -> tuple[Coordinator, _Driver]:
    """A coordinator built as the app builds it: rounds of at least ``min_tables`` tables as Spark
    jobs (the tasks get ``config``, the sink's by default), the rest on the driver's counted runner."""
    driver = _Driver(ThreadedCommits(TableCommitter(sink.name, sink.catalog)))
    setup = TaskSetup.of(config or sink.config, sink.channel)
    runner = SparkTableCommits(session, setup, driver, min_tables=min_tables)
    coordinator = sink.coordinator(table_commits=runner)
    assert coordinator.table_commits is runner
    return coordinator, driver


def _round(sink_factory: SinkFactory) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Tables a, b and c with ids 0-29 delivered and announced, not committed yet."""
    sink = sink_factory(partitions={"src": 1}, tables="abc", prefix="sc")
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "abc"[i % 3]} for i in range(30)])
    sink.batch()
    return sink, {t: [i for i in range(30) if "abc"[i % 3] == t] for t in "abc"}


def test_a_round_of_tables_is_committed_once_by_spark_tasks(
    spark: Any, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, expected = _round(sink_factory)
    coordinator, driver = _coordinator(sink, _session(spark), min_tables=3)
    result = coordinator.commit_round()
    assert {c.outcome for c in result.tables.values()} == {"committed"}
    assert driver.tables == []  # every outcome came from the job's tasks
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    # The next round's floor check happens wherever the commit runs: nothing is appended twice.
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": 30, "table": "a"}])
    sink.batch()
    assert {t: c.outcome for t, c in coordinator.commit_round().tables.items()} == {"sink.a": "committed"}
    assert table_ids(catalog, "a") == [*expected["a"], 30]
    coordinator.close()


def test_a_round_of_fewer_tables_than_the_minimum_stays_on_the_driver(
    spark: Any, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, expected = _round(sink_factory)
    coordinator, driver = _coordinator(sink, _session(spark), min_tables=4)
    assert {c.outcome for c in coordinator.commit_round().tables.values()} == {"committed"}
    assert driver.tables == ["sink.a", "sink.b", "sink.c"]
    assert table_ids(catalog, "b") == expected["b"]
    coordinator.close()


def test_tables_a_failed_commit_job_left_without_outcome_are_committed_on_the_driver(
    spark: Any, sink_factory: SinkFactory, catalog: Any
) -> None:
    """The executors cannot open the catalog (their copy of the config names a catalog type that does
    not exist): every task fails, the job gives no outcome, and the driver commits the round."""
    sink, expected = _round(sink_factory)
    unreachable = CatalogSettings(name="nowhere", type="no-such-type")
    config = sink.config.model_copy(update={"catalog": unreachable})
    coordinator, driver = _coordinator(sink, _session(spark), min_tables=1, config=config)
    result = coordinator.commit_round()
    assert {c.outcome for c in result.tables.values()} == {"committed"}
    assert driver.tables == ["sink.a", "sink.b", "sink.c"]
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()


def test_a_runner_built_before_the_session_exists_commits_on_the_driver_until_it_does(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """The app builds its coordinator with the executor runner while the driver JVM starts: until the
    session's SparkContext is set, every round, however large, commits on the driver."""
    sink, expected = _round(sink_factory)
    coordinator, driver = _coordinator(sink, Future(), min_tables=1)
    assert {c.outcome for c in coordinator.commit_round().tables.values()} == {"committed"}
    assert driver.tables == ["sink.a", "sink.b", "sink.c"]
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()


def test_a_round_while_a_batch_holds_every_slot_commits_on_the_driver_without_waiting_for_one(
    spark: Any, sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that plans a backlog holds every slot for minutes (its tasks deliver it in steps): a
    commit job would wait ``START_WAIT_S`` for a slot every round, then be cancelled. None is submitted."""
    sink, expected = _round(sink_factory)
    coordinator, driver = _coordinator(sink, _session(spark), min_tables=1)
    context = spark.sparkContext
    slots = context.defaultParallelism
    release = threading.Event()

    def hold_every_slot() -> None:
        context.setJobGroup("paced-batch", "a batch holding every slot", True)
        try:
            context.parallelize(range(slots), slots).map(lambda _: time.sleep(600)).collect()
        except Exception:  # cancelled below
            assert release.is_set()

    batch = threading.Thread(target=hold_every_slot)
    batch.start()
    try:
        tracker = context.statusTracker()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            if sum(s.numActiveTasks for s in stages if s is not None) >= slots:
                break
            time.sleep(0.1)
        with caplog.at_level(logging.INFO, logger="fanout_sink"):
            result = coordinator.commit_round()
        assert {c.outcome for c in result.tables.values()} == {"committed"}
        assert driver.tables == ["sink.a", "sink.b", "sink.c"]
        assert "cancelling the commit job" not in caplog.text, "a commit job was submitted and waited"
        for table in "abc":
            assert table_ids(catalog, table) == expected[table]
    finally:
        release.set()
        context.cancelJobGroup("paced-batch")
        batch.join(60)
        coordinator.close()
