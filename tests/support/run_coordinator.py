"""Child process: open the sink's coordinator and run one commit round, tables one at a time.

Usage: python run_coordinator.py '<json: bootstrap, sink, control, topics, catalog>'. Tests set
FANOUT_SINK_FAULTS to kill it between two tables' commits.
"""

from __future__ import annotations

import json
import sys

from common import catalog_from

from fanout_sink.protocol.coordinator import Coordinator


def main() -> int:
    cfg = json.loads(sys.argv[1])
    coordinator = Coordinator(
        cfg["sink"],
        {"bootstrap.servers": cfg["bootstrap"]},
        cfg["control"],
        catalog_from(cfg["catalog"]),
        source_topics=list(cfg["topics"]),
        max_parallel_commits=1,
    )
    coordinator.open()
    result = coordinator.commit_round()
    print(json.dumps({t: o.outcome for t, o in result.tables.items()}))
    coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
