"""Child process: one micro-batch of the worker, replaying what Spark planned for it.

Usage: python run_worker.py '<json: bootstrap, sink, control, topics, catalog, checkpoint, batch>'.
The ranges are those of batch ``batch`` in the checkpoint (``planning.planned_ranges``): after a
crash Spark re-runs its last planned batch with exactly these ranges, whatever the sink group says,
so the worker's skip, overlap and gap checks decide what is left. Tests set FANOUT_SINK_FAULTS to kill
or pause it at an exact step.
"""

from __future__ import annotations

import json
import sys

from common import catalog_from, make_processor, run_planned_batch

from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark.planning import planned_ranges


def main() -> int:
    cfg = json.loads(sys.argv[1])
    catalog = catalog_from(cfg["catalog"])
    worker = SliceWorker(
        SinkChannel(cfg["sink"], {"bootstrap.servers": cfg["bootstrap"]}, cfg["control"]),
        dead_letter_topic=cfg.get("dlq"),
    )
    ranges = planned_ranges(cfg["checkpoint"], cfg["batch"])
    results = run_planned_batch(worker, cfg["bootstrap"], ranges, make_processor(catalog))
    print(json.dumps([[r.topic, r.partition, r.transaction_committed, r.skipped_delivered] for r in results]))
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
