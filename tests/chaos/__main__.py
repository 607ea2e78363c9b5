"""``PYTHONPATH=tests python -m chaos``: one chaos run, one verdict line, exit 0 only on PASS."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chaos.kills import KINDS
from chaos.runner import ChaosOptions, ChaosRun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--cycles", type=int, default=5, help="breakages, one per cycle (default 5)")
    parser.add_argument("--records", type=int, default=20_000, help="records to produce (default 20000)")
    parser.add_argument("--seed", type=int, default=1, help="seeds kinds, moments and records (default 1)")
    parser.add_argument(
        "--change-events",
        type=int,
        default=5000,
        help="Debezium change events beside the records, into a change table checked key by key "
        "(default 5000; 0: append traffic only)",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)} (default all)"
    )
    parser.add_argument("--work-dir", type=Path, help="where the run keeps everything (default: a temp dir)")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    options = ChaosOptions(
        args.cycles, args.records, args.seed, kinds, args.work_dir, change_events=args.change_events
    )
    result = ChaosRun(options).run()
    for problem in result.verdict.problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"work dir: {result.work_dir} (chaos.log, app.log, verdict.json)", file=sys.stderr)
    print(result.line(), flush=True)
    return 0 if result.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
