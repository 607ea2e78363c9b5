"""What the batch runner carries from a failed attempt to the next, and what it does not retry.

The driver's record of schema ids the registry did not know (issue 47 item 3): an id a task found
unknown is handed to the next attempt's tasks with when it was first seen, and an id a task's
registry has served since leaves the record, so a process started later counts a lagging
follower's 404 for it from then, not from the id's first sighting long ago. A newer start's refusal
(issue 47 item 1) is not retried: every attempt would meet it.

No Spark: the micro-batch's context is a stand-in that records what each job's tasks were handed
and answers with a task failure or the tasks' reports."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from fanout_sink.config.loading import parse_config
from fanout_sink.errors import StartSupersededError, UnknownSchemaIdError
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.spark import batch, planning
from fanout_sink.spark.batch import BatchRunner
from fanout_sink.spark.executor_context import TaskSetup
from fanout_sink.spark.task import SliceReport

SCHEMA_ID = 42
PLANNED = Slice("orders", 0, 0, 10)


class _Context:
    """``parallelize(...).mapPartitions(task).collect()``: each job's outcome in turn."""

    def __init__(self, outcomes: list[Exception | list[SliceReport]]) -> None:
        self.outcomes = outcomes
        self.handed: list[dict[int, float]] = []
        """The unknown schema ids each job's tasks were handed."""

    def setJobGroup(self, group: str, description: str, interrupt: bool) -> None:
        pass

    def setLocalProperty(self, key: str, value: str | None) -> None:
        pass

    def parallelize(self, elements: Any, numSlices: int) -> _Context:
        return self

    def mapPartitions(self, task: Any) -> _Context:
        self.handed.append(dict(task.args[2]))
        return self

    def collect(self) -> list[SliceReport]:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def _report(served: tuple[int, ...]) -> SliceReport:
    return SliceReport(SliceResult(PLANNED, 0, records_in=10, transaction_committed=True), 100, served)


CONFIG = parse_config({"name": "shop", "source": {"topics": ["orders"]}, "tables": {"a.orders": {}}})


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> BatchRunner:
    """A runner of 3 attempts whose batches each plan ``PLANNED``."""
    monkeypatch.setattr(
        planning, "planned_ranges", lambda *args: {("orders", 0): (PLANNED.start, PLANNED.end)}
    )
    monkeypatch.setattr(batch, "topic_ids", lambda *args: {})
    return BatchRunner(
        TaskSetup.of(CONFIG, SinkChannel.from_config(CONFIG, PartitionGroups(2))),
        retries=3,
        coordinator_error=lambda: None,
    )


def test_an_id_a_task_reports_served_is_no_longer_handed_to_later_tasks(runner: BatchRunner) -> None:
    first_seen = time.time()
    unknown = UnknownSchemaIdError(
        {SCHEMA_ID: first_seen}, CONFIG.source.unknown_schema_id_timeout.total_seconds()
    )
    context = _Context(
        [
            Exception(
                f"Job aborted.\nTraceback (most recent call last):\n  ...\nUnknownSchemaIdError: {unknown}\n"
            ),
            [_report(served=(SCHEMA_ID,))],  # the retry: the registry served the id
            [_report(served=())],
        ]
    )
    frame = SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context))

    runner(frame, 1)
    runner(frame, 2)

    assert context.handed[0] == {}
    assert context.handed[1] == {SCHEMA_ID: pytest.approx(first_seen, abs=1e-3)}
    assert context.handed[2] == {}, "an id the registry served is not handed on as unknown since long ago"


def test_a_batch_a_later_start_superseded_is_not_retried(runner: BatchRunner) -> None:
    """A newer start of the sink refuses this app's every attempt the same way: retrying the batch
    only repeats the refusal, so the first one stops the app with the newer start's line."""
    line = (
        "sink 'shop' was started again (start 2-b, 3 partition groups) after this app's start 1-a: "
        "the newer start delivers its ranges, so this attempt does not."
    )
    context = _Context(
        [
            Exception(
                f"Job aborted.\nTraceback (most recent call last):\n  ...\n"
                f"fanout_sink.errors.StartSupersededError: {line}\n\n\tat org.apache.spark"
            ),
            [_report(served=())],
        ]
    )
    frame = SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context))

    with pytest.raises(StartSupersededError) as stopped:
        runner(frame, 1)

    assert str(stopped.value) == line
    assert len(context.handed) == 1, "the batch was tried again after a newer start refused it"
    assert str(runner.failure) == f"batch 1 was not delivered: {line}", "the app's one-line stop"
