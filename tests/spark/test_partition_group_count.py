"""How many partition groups the app packs into, from the settings its session is built from."""

from __future__ import annotations

import os

from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.spark.partition_group_count import DEFAULT_GROUPS, decide, group_count


def _config(**spark: object) -> SinkConfig:
    return SinkConfig.model_validate(
        {
            "name": "s",
            "source": {"topics": ["t"], "format": "json"},
            "tables": {"db.t": {}},
            "spark": spark,
        }
    )


def test_the_count_follows_the_executors_cores_unless_set() -> None:
    assert group_count(_config(), "local[3]", {})[0] == 3
    assert group_count(_config(), "local", {})[0] == 1
    assert group_count(_config(), "local[*]", {})[0] == (os.cpu_count() or 1)
    assert group_count(_config(), "local-cluster[2, 3, 1024]", {})[0] == 6
    cluster = {"spark.executor.instances": "4", "spark.executor.cores": "5"}
    assert group_count(_config(), "spark://host:7077", cluster)[0] == 20
    assert group_count(_config(), "spark://host:7077", {**cluster, "spark.default.parallelism": "7"})[0] == 7
    assert group_count(_config(**{"partition-groups": 12}), "local[3]", {})[0] == 12
    count, source = group_count(_config(), "yarn", {})
    assert count == DEFAULT_GROUPS and "spark.partition-groups" in source


def test_the_decided_count_is_the_runs_layout_and_the_config_stays_as_written() -> None:
    config = _config()
    assert decide(config, "local[2]", {}) == PartitionGroups(2)
    assert config.spark.partition_groups is None


def test_the_app_holds_one_channel_under_the_decided_layout_and_hands_it_to_every_task() -> None:
    from fanout_sink.spark.app import RunOptions, SinkApp

    app = SinkApp(_config(), RunOptions(master="local[3]"))
    assert app.channel.groups == PartitionGroups(3)
    assert app.tasks.channel.groups == app.channel.groups and app.batches.setup is app.tasks
    assert app.config.spark.partition_groups is None  # the config is not rewritten
