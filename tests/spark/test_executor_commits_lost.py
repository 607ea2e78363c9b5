"""A commit job whose task committed a table and was lost before it reported (issue 47 item 7 (i)).

The driver commits what the job gave no outcome for; for the table the lost task committed, that
finds the table's floor ("already-committed"). Such an outcome used to publish no ``CommitToTable``,
so the coordinator's ``committed_through`` never learnt the floor of that table uuid: when a table
that failed in the same round kept the low watermark below the lost table's events, and that table
was dropped and recreated before they were read again, its files were rewritten into the new table,
although the old one had them when it was dropped (rows in both). No Spark: the SparkContext is a
stand-in whose job commits one table on an "executor" (the round pickled to it, a catalog of its
own) and then fails as a lost task does; the rest is the real runner, coordinator, broker and
catalog."""

from __future__ import annotations

import pickle
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from support.common import NAMESPACE, TABLE_SCHEMA, produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.catalog import load_catalog
from fanout_sink.protocol.commit_runners import RoundTables, commit_in_threads
from fanout_sink.protocol.table_commit import TableCommitter
from fanout_sink.spark.executor_commits import SparkTableCommits
from fanout_sink.spark.executor_context import TaskSetup


class _JobLosingItsTask:
    """``parallelize(shares).mapPartitions(task).collect()``: commits ``table`` of the round where an
    executor would, then fails as a job whose task was lost past its retries."""

    defaultParallelism = 1

    def __init__(self, sink: SinkUnderTest, table: str) -> None:
        self.sink = sink
        self.table = table
        self.shares: list[RoundTables] = []

    def setJobGroup(self, *args: Any) -> None: ...

    def statusTracker(self) -> Any:
        """No batch holds a slot: the round goes to the (lost) job, not straight to the driver."""
        return SimpleNamespace(getActiveStageIds=list)

    def setLocalProperty(self, *args: Any) -> None: ...

    def parallelize(self, shares: list[RoundTables], numSlices: int) -> _JobLosingItsTask:
        self.shares = [pickle.loads(pickle.dumps(share)) for share in shares]
        return self

    def mapPartitions(self, task: Any) -> _JobLosingItsTask:
        return self

    def collect(self) -> list[Any]:
        committer = TableCommitter(self.sink.name, load_catalog(self.sink.settings))
        for share in self.shares:
            commit_in_threads(committer, share.only([self.table]), 1)
        raise RuntimeError("Job aborted: Python worker exited unexpectedly (crashed)")


def test_a_table_committed_by_a_lost_task_announces_its_floor_so_a_recreated_table_never_gets_its_files(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="ad", prefix="lost")
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "d"} for i in range(5)])
    sink.batch()  # d's files first on the control topic: its failing commit holds the watermark below a's
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "a"} for i in range(5, 10)])
    sink.batch()
    coordinator = sink.coordinator()
    context: Future[Any] = Future()
    context.set_result(_JobLosingItsTask(sink, "sink.a"))
    coordinator.table_commits = SparkTableCommits(
        context, TaskSetup.of(sink.config, sink.channel), on_driver=coordinator.table_commits, min_tables=1
    )

    def refuse_d(table: str, **_: Any) -> None:
        if table == "sink.d":
            raise RuntimeError("catalog unavailable")

    with faults.register("coordinator.before-table-commit", refuse_d):
        first = coordinator.commit_round()
    assert {t: c.outcome for t, c in first.tables.items()} == {
        "sink.a": "already-committed",
        "sink.d": "failed",
    }
    assert table_ids(catalog, "a") == list(range(5, 10))
    assert first.low_watermark < first.round_end  # d's files hold it below a's events
    coordinator.close()

    catalog.drop_table(f"{NAMESPACE}.a")  # the operator recreates table a: the old one held ids 5-9
    catalog.create_table(f"{NAMESPACE}.a", schema=TABLE_SCHEMA)
    restarted = sink.coordinator()  # reads a's events again from the low watermark
    second = restarted.commit_round()
    assert {t: c.outcome for t, c in second.tables.items()} == {
        "sink.a": "already-committed",
        "sink.d": "committed",
    }
    assert table_ids(catalog, "a") == [], "rows the dropped table held were rewritten into the new one"
    assert table_ids(catalog, "d") == list(range(5))
    restarted.close()
