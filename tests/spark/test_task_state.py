"""The executor context a Python worker builds once (spark/executor_context.py) leaves the garbage
collector only the objects a slice creates: what exists once it is built is frozen, later cycles are
still collected.

Run in a child interpreter: freezing is process-wide and would change the test process's collector.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from fanout_sink.config.loading import parse_config
    from fanout_sink.protocol.channel import SinkChannel
    from fanout_sink.protocol.partition_groups import PartitionGroups
    from fanout_sink.spark.executor_context import TaskSetup, executor_context

    folder = sys.argv[1]
    config = parse_config(
        {
            "name": "gc",
            "kafka": {"bootstrap.servers": "127.0.0.1:1"},
            "source": {"topics": ["t"]},
            "catalog": {"name": "c", "type": "sql", "uri": f"sqlite:///{folder}/c.db",
                        "warehouse": f"file://{folder}/w"},
            "tables": {"n.t": {"when": "true"}},
        },
        "gc",
    )
    before = gc.get_freeze_count()
    channel = SinkChannel.from_config(config, PartitionGroups(2))
    executor_context(TaskSetup.of(config, channel)).delivery()
    frozen = gc.get_freeze_count()

    class Node:
        pass

    cycle = Node()
    cycle.self = cycle
    alive = weakref.ref(cycle)
    del cycle
    gc.collect()
    print(json.dumps({"before": before, "frozen": frozen, "cycle_collected": alive() is None}))
    """
)


def test_executor_state_freezes_what_exists_once_it_is_built_and_later_cycles_are_collected(
    tmp_path: Path,
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["before"] == 0
    # The imports alone leave tens of thousands of tracked objects: all of them are frozen.
    assert seen["frozen"] > 10_000, seen
    assert seen["cycle_collected"], "a cycle made after the freeze must still be collected"
