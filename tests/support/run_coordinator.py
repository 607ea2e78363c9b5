"""Child process: open the sink's coordinator and run one commit round, tables one at a time.

Usage: python run_coordinator.py <sink.yaml> ['<json: serve>'] (``support.sink_factory`` writes the
YAML). Tests set FANOUT_SINK_FAULTS to kill it between two tables' commits. A table with a
``commit-interval`` of its own commits only when due, as in the app. With ``serve``
(``commit_interval_s``, ``offsets_refresh_interval_s``) it runs the coordinator's thread until SIGTERM
instead, and exits 1 as soon as the coordinator fails: a long-running coordinator in its own process
is out of reach of the in-process fault callbacks other tests register meanwhile. A served
coordinator also stops when the test process that started it is gone (killed by a timeout, say), so
it never outlives the suite.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from common import sink_channel

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings
from fanout_sink.protocol.table_cadence import CommitIntervals


def serve(coordinator: Coordinator) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    coordinator.start()
    while not stop.wait(0.5) and coordinator.error is None:
        if os.getppid() != parent:  # orphaned: re-parented to init or a subreaper
            break
    if coordinator.error is not None:
        print(f"coordinator failed: {coordinator.error!r}", file=sys.stderr, flush=True)
        return 1
    coordinator.stop(commit_now=False)
    coordinator.close()
    return 0


def main() -> int:
    config = load_config(sys.argv[1])
    intervals = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    coordinator = Coordinator(
        sink_channel(config),
        load_catalog(config.catalog),
        CoordinatorSettings(
            source_topics=tuple(sorted(set(config.source.topics))),
            max_parallel_commits=1,
            commit_intervals=CommitIntervals.of(config),  # the tables' own commit-interval, as the app's
            **intervals,
        ),
    )
    if intervals:
        return serve(coordinator)
    coordinator.open()
    result = coordinator.commit_round()
    print(json.dumps({t: o.outcome for t, o in result.tables.items()}))
    coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
