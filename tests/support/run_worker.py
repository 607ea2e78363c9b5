"""Child process: one micro-batch of the worker, replaying what Spark planned for it.

Usage: python run_worker.py <sink.yaml> <batch> (``support.sink_factory`` writes the YAML).
The ranges are those of batch ``batch`` in the sink's checkpoint (``planning.planned_ranges``): after a
crash Spark re-runs its last planned batch with exactly these ranges, whatever the sink group says,
so the worker's skip, overlap and gap checks decide what is left. Tests set FANOUT_SINK_FAULTS to kill
or pause it at an exact step.
"""

from __future__ import annotations

import json
import sys

from common import make_processor, run_planned_batch, sink_channel

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark.planning import planned_ranges


def main() -> int:
    config = load_config(sys.argv[1])
    dlq = config.dead_letter.topic if config.dead_letter is not None else None
    worker = SliceWorker(sink_channel(config), dead_letter_topic=dlq)
    ranges = planned_ranges(config.checkpoint_location, int(sys.argv[2]))
    bootstrap = config.kafka["bootstrap.servers"]
    results = run_planned_batch(worker, bootstrap, ranges, make_processor(load_catalog(config.catalog)))
    print(
        json.dumps(
            [
                [r.slice.topic, r.slice.partition, r.transaction_committed, r.skipped_delivered]
                for r in results
            ]
        )
    )
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
