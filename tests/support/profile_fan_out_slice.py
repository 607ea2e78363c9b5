"""One fan-out slice's CPU in one process: N dynamic tables, R JSON records routed by a ``kind`` field,
the processor and ``RollingFiles`` (rows held, then written at finish), after a warm-up slice that
creates the tables; with ``--profile``, cProfile's top entries by cumulative time.

    PYTHONPATH=. .venv/bin/python tests/support/profile_fan_out_slice.py --tables 2000 [--profile]

No broker, no Spark: what a worker pays per table and file of a slice (docs/benchmarks/wide-sinks.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.protocol.rolling_files import RollingFiles
from fanout_sink.transform.processor import build_processor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=500)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 30 entries")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="fan-out-slice-")
    settings = CatalogSettings(
        name="p", type="sql", uri=f"sqlite:///{folder}/c.db", warehouse=f"file://{folder}/w"
    )
    dynamic = {"table": "join('.', ['raw', kind])", "allow": r"^raw\.[a-z0-9_]+$", "auto-create": True}
    data = {"name": "p", "source": {"topics": ["events"]}, "catalog": settings.model_dump()}
    data["dynamic"] = dynamic
    process = build_processor(parse_config(data, "profile", base_dir=Path(".")), load_catalog(settings))
    values = [
        json.dumps({"type": "event", "kind": f"k{n % args.tables}", "n": n, "s": "x" * 30}).encode()
        for n in range(args.records)
    ]
    started = time.monotonic()
    process(make_raw_slice(values[: args.tables]))
    print(f"warm-up, {args.tables} tables created: {time.monotonic() - started:.1f} s")
    raw = make_raw_slice(values)

    def slice_once() -> None:
        rolling = RollingFiles()
        for name, routed in process(raw).tables.items():
            rolling.add(name, routed.table, routed.rows)
        rolling.finish()

    slice_once()  # the first slice over the tables pays their per-process caches
    profile = cProfile.Profile() if args.profile else None
    cpu, wall = time.process_time(), time.monotonic()
    if profile:
        profile.enable()
    slice_once()
    if profile:
        profile.disable()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    print(f"{args.tables} tables, {args.records} records: {cpu:.2f} s CPU, {wall:.2f} s wall, "
          f"{1000 * cpu / args.tables:.2f} ms CPU per table")  # fmt: skip
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
