"""Child process: one micro-batch of the worker over every source partition (see common.run_batch).

Usage: python run_worker.py '<json: bootstrap, sink, control, topics, catalog>'. Tests set
FANOUT_SINK_FAULTS to kill or pause it at an exact step.
"""

from __future__ import annotations

import json
import sys

from common import catalog_from, make_processor, run_batch

from fanout_sink.protocol.worker import SliceWorker


def main() -> int:
    cfg = json.loads(sys.argv[1])
    catalog = catalog_from(cfg["catalog"])
    worker = SliceWorker(
        cfg["sink"], {"bootstrap.servers": cfg["bootstrap"]}, cfg["control"], dead_letter_topic=cfg.get("dlq")
    )
    results = run_batch(worker, cfg["bootstrap"], cfg["topics"], make_processor(catalog))
    print(json.dumps([[r.topic, r.partition, r.transaction_committed, r.skipped_delivered] for r in results]))
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
