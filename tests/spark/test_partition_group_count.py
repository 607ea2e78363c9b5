"""How many partition groups the app packs into, from the settings its session is built from."""

from __future__ import annotations

import os

from fanout_sink.config.models import SinkConfig
from fanout_sink.spark.partition_group_count import DEFAULT_GROUPS, group_count, with_group_count


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


def test_the_decided_count_travels_in_the_config_every_process_gets() -> None:
    decided = with_group_count(_config(), "local[2]", {})
    assert decided.spark.partition_groups == 2
