"""The app with its commit rounds spread over Spark tasks (``control.distributed-commit-min-tables``),
a commit task's Python worker SIGKILLed right after its first table's commit: exact ids per table."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.sink_factory import SinkFactory, SinkUnderTest

pytestmark = pytest.mark.usefixtures("own_spark")

KILL_POINT = "coordinator.after-table-commit"
"""In ``TableCommitter.commit``, after the catalog accepted a table's snapshot and before the outcome
is returned: the table holds its floor, the task's other tables do not, the driver knows nothing."""


def _distributed_sink(sink_factory: SinkFactory) -> SinkUnderTest:
    """The shop sink (six tables), every commit round of at least one table run as a Spark job."""
    name = f"dc-{uuid.uuid4().hex[:6]}"
    control = {"topic": f"{name}-control", "commit-interval": "2s", "distributed-commit-min-tables": 1}
    return sink_factory(name=name, overrides={"control": control})


def test_a_commit_task_killed_mid_share_is_retried_by_spark_and_every_row_lands_once(
    sink_factory: SinkFactory, tmp_path: Path
) -> None:
    sink = _distributed_sink(sink_factory)
    sink.produce(900)
    marker = tmp_path / "commit-task-killed"
    log = sink.run(
        "--available-now",
        "--master", "local-cluster[2,1,1024]",
        "--conf", f"spark.executorEnv.FANOUT_SINK_FAULTS={KILL_POINT}=kill-once:{marker}",
        "--conf", "spark.task.maxFailures=4",
    )  # fmt: skip
    assert marker.exists(), "no commit task's Python worker was killed after a table's commit"
    assert "Spark task(s)" in log, log[-3000:]  # a round's outcomes came back from the job's tasks
    sink.assert_exact()


def test_a_commit_task_killed_without_task_retries_leaves_the_round_to_the_driver(
    sink_factory: SinkFactory, tmp_path: Path
) -> None:
    """``local[2]`` retries no task: the killed task fails the job, and the driver commits the round's
    tables in the same round (those the task committed are found at their floor)."""
    sink = _distributed_sink(sink_factory)
    sink.produce(900)
    marker = tmp_path / "commit-task-killed"
    log = sink.run(
        "--available-now",
        "--master", "local[2]",
        "--conf", f"spark.executorEnv.FANOUT_SINK_FAULTS={KILL_POINT}=kill-once:{marker}",
    )  # fmt: skip
    assert marker.exists(), "no commit task's Python worker was killed after a table's commit"
    assert "committed on the driver" in log, log[-3000:]
    sink.assert_exact()
