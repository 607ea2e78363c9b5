"""The ``fanout-sink`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fanout-sink")
    commands = parser.add_subparsers(dest="command")
    status = commands.add_parser("status", help="per table: last commit, VTTS; per source partition: lag")
    status.add_argument("--config", required=True, type=Path, help="the sink's YAML config")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if args.command == "status":
        from fanout_sink.status import run as status_run

        print(status_run(args.config, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
