"""How many partition groups the app packs its source partitions into, decided once at start.

The count must be known before the Spark session exists: planning restores recovered positions
under the groups' transactional ids, and the old layout's ids are fenced, before the driver JVM
starts (the session is built in parallel with the coordinator). So it comes from the settings the
session will be built from, not from ``SparkContext.defaultParallelism``. One group per core keeps
every core busy in a batch without paying a task, a transaction and a producer per partition.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

from fanout_sink.config.models import SinkConfig
from fanout_sink.protocol.partition_groups import PartitionGroups

log = logging.getLogger("fanout_sink.app")

DEFAULT_GROUPS = 8
"""For a cluster master whose cores the settings do not say (dynamic allocation, for example)."""

_LOCAL = re.compile(r"local(?:\[(?P<cores>\d+|\*)(?:,\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[(?P<workers>\d+),\s*(?P<cores>\d+),\s*\d+\]")


def group_count(config: SinkConfig, master: str, conf: Mapping[str, str]) -> tuple[int, str]:
    """The group count and where it came from (for the start's log line)."""
    if config.spark.partition_groups is not None:
        return config.spark.partition_groups, "spark.partition-groups"
    if "spark.default.parallelism" in conf:
        return max(1, int(conf["spark.default.parallelism"])), "spark.default.parallelism"
    if local := _LOCAL.fullmatch(master):
        cores = local.group("cores")
        count = 1 if cores is None else (os.cpu_count() or 1) if cores == "*" else int(cores)
        return max(1, count), f"the cores of master {master}"
    if cluster := _LOCAL_CLUSTER.fullmatch(master):
        return int(cluster.group("workers")) * int(cluster.group("cores")), f"the cores of master {master}"
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances is not None and cores is not None:
        return max(1, int(instances) * int(cores)), "spark.executor.instances x spark.executor.cores"
    return DEFAULT_GROUPS, (
        "the default (set spark.partition-groups to the executors' total cores: the settings do not say them)"
    )


def decide(config: SinkConfig, master: str, conf: Mapping[str, str]) -> PartitionGroups:
    """The run's layout: the driver decides it once, puts it in the one channel it hands to planning,
    the batches and the coordinator, and records it (``protocol/group_layout.py``) for every other
    process; the config stays as it was written."""
    count, source = group_count(config, master, conf)
    log.info("packing source partitions into %d partition group(s) (from %s)", count, source)
    return PartitionGroups(count)
