"""The app starts its Python workers and their executor state while the query plans its first batch
(spark/worker_warmup.py): the batch's tasks then find both ready in the workers Spark reuses."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fanout_sink.config.loading import parse_config
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.spark import worker_warmup
from fanout_sink.spark.executor_context import TaskSetup


def _setup(folder: Path) -> TaskSetup:
    config = parse_config(
        {
            "name": "warm",
            "kafka": {"bootstrap.servers": "127.0.0.1:1"},  # building the state asks no broker
            "source": {"topics": ["t"]},
            "catalog": {"name": "c", "type": "sql", "uri": f"sqlite:///{folder}/c.db", "warehouse": f"file://{folder}/w"},
            "tables": {"n.t": {"when": "true"}},
        },
        "warm",
    )  # fmt: skip
    return TaskSetup.of(config, SinkChannel.from_config(config, PartitionGroups(2)))


def test_the_next_tasks_find_every_task_slots_worker_warmed(spark: Any, tmp_path: Path) -> None:
    context = spark.sparkContext
    setup = _setup(tmp_path)
    slots = context.defaultParallelism
    thread = worker_warmup.start(context, setup)
    thread.join(timeout=300)
    assert not thread.is_alive()
    # The next tasks run in the same (reused) Python workers: each holds the state already, so none
    # builds it (without the warm-up, each would: True per slot).
    tasks = context.parallelize(range(slots), slots).mapPartitions(
        functools.partial(worker_warmup.warm, setup)
    )
    assert tasks.collect() == [False] * slots
