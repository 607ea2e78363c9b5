"""A stop that lands between two micro-batches: the next batch must end at once, not wait.

The app's stopper holds the batch lock only to see no batch mid-way and to set ``stopping``; Spark's
``query.stop()`` then waits for its stream thread, which may already be entering the next batch's
``foreachBatch``. That batch must neither deliver anything nor wait for the stop (it used to wait
for the lock the stopper held while stopping: a deadlock the chaos run met under back-to-back
batches), and Spark must not mark it done.
"""

from __future__ import annotations

import pytest

from fanout_sink.config.loading import parse_config
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.spark.batch import BatchRunner, StopRequested
from fanout_sink.spark.executor_context import TaskSetup


class _Frame:
    """A micro-batch DataFrame that fails the test if the batch goes as far as planning."""

    @property
    def sparkSession(self) -> None:
        raise AssertionError("a batch that began after the stop planned its ranges")


def test_a_batch_that_begins_after_the_stop_delivers_nothing_and_ends_at_once() -> None:
    config = parse_config({"name": "shop", "source": {"topics": ["orders"]}, "tables": {"a.orders": {}}})
    channel = SinkChannel.from_config(config, PartitionGroups(2))
    runner = BatchRunner(TaskSetup.of(config, channel), retries=3, coordinator_error=lambda: None)
    runner.stopping.set()

    with pytest.raises(StopRequested, match=r"batch 7 .* not started: the app is stopping"):
        runner(_Frame(), 7)

    assert not runner.lock.locked() and runner.failure is None
