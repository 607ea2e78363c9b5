"""300 topics into 300 auto-created tables, fanout_sink then the Iceberg Kafka Connect sink (issue 50's
side-by-side target: wall at most 0.3x the Java peer's, CPU at most 0.5x, peak RSS at most 0.6x).

    PYTHONPATH=tests python -m bench.many_topics_side_by_side --topics 300 --events 60000 \\
      --out docs/benchmarks

The shape the issue measured (a whole database's topics): ``--topics`` topics of one partition each,
``--events`` JSON events produced up front (event ``n`` to topic ``n % topics``, its ``tbl`` field
holding its table's whole name ``db.t<i>``, a unique ``id``), appends only. Each system then starts
on all of them, into a fresh SQLite catalog of its own (the namespace ``db`` made first, no table),
matches the topics by a pattern, routes every record by ``tbl`` and auto-creates its 300 tables:

- fanout_sink: ``run --available-now``, ``local[N]``, ``source.pattern`` + ``dynamic.table: tbl``
  with ``auto-create`` (``bench.many_topics``' sink YAML);
- Connect standalone, ``tasks.max`` N, ``topics.regex``, ``iceberg.tables.dynamic-enabled`` on
  ``tbl``, ``iceberg.tables.auto-create-enabled``; the same commit interval.

Wall is from a system's start to every table holding all its rows (its catalog polled every
:data:`POLL_S`; the system gets SIGTERM then); CPU seconds and peak RSS are of its whole process
tree (``bench.proctree``). Every table's ids are then read through PyIceberg, none missing, none
twice, in both. Figures merge into ``<out>/many-topics-side-by-side.json``; the page
``<out>/many-topics-side-by-side.md`` is rendered from it below its hand-written part.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench import connect_peer, many_topics, ours
from bench.backlog import Watch, render_below, start_systems
from bench.context import CATALOG_NAME, catalog_settings, child_env
from bench.landed import VisibleRows
from bench.proctree import run_child
from bench.side_by_side import machine_facts
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.kafka.clients import KafkaClientFactory

OURS = "fanout_sink"
SYSTEMS = ("ours", "connect")
TARGETS = {"wall": 0.3, "cpu": 0.5, "rss": 0.6}
"""Issue 50: fanout_sink's wall, CPU seconds and peak RSS at most these shares of the Java peer's."""
LABELS = {"wall": "wall", "cpu": "CPU s", "rss": "peak RSS"}
ROUTE_FIELD = "tbl"
POLL_S = 0.5
"""How often a system's catalog is polled for visible rows: the resolution of the wall."""
JSON_NAME = "many-topics-side-by-side.json"
MARKER = "<!-- bench.many_topics_side_by_side renders everything below this line from its JSON -->"


@dataclass(frozen=True)
class SystemFigures:
    """One system's run: from its start to every table holding its rows."""

    system: str
    wall_s: float
    first_visible_s: float | None
    records_per_s: float
    cpu_s: float
    peak_rss_mb: float
    role_cpu_s: dict[str, float]
    role_rss_mb: dict[str, float]
    tables_exact: int
    problems: list[str]
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    phases: dict[str, float] = field(default_factory=dict)
    """fanout_sink's, from its log: seconds from start to the Spark session, to the first batch's
    start, the batch(es), the final commit round's line (where the wall goes)."""
    class_archive: str | None = None
    """fanout_sink's, from its log: what its driver JVM did with the class archive (``mapped``,
    ``refused``, ``dumping``, ``none``): a run without one spends ~4 JVM CPU s and seconds more."""


def ours_config(
    name: str, prefix: str, bootstrap: str, settings: CatalogSettings, folder: Path, cores: int,
    commit_interval_s: float,
) -> dict[str, Any]:  # fmt: skip
    """fanout_sink's YAML: ``bench.many_topics``' (the pattern, auto-create into ``db``), the table
    named by ``tbl`` as a whole (as Connect takes it), ``local[cores]``."""
    config = many_topics.sink_config(name, prefix, bootstrap, settings, folder)
    config["dynamic"]["table"] = ROUTE_FIELD
    config["spark"]["master"] = f"local[{cores}]"
    config["control"]["commit-interval"] = f"{commit_interval_s:g}s"
    return config


def connector_config(
    name: str, prefix: str, bootstrap: str, settings: CatalogSettings, cores: int, commit_interval_s: float
) -> dict[str, str]:
    """The Connect sink's connector: the same topic pattern, the table named by ``tbl``, auto-created."""
    return {
        "name": name,
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": str(cores),
        "topics.regex": many_topics.topic_pattern(prefix),
        "iceberg.tables.route-field": ROUTE_FIELD,
        "iceberg.tables.dynamic-enabled": "true",
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.control.topic": f"{name}-control",
        "iceberg.control.group-id-prefix": f"{name}-cg",
        "iceberg.control.commit.interval-ms": str(int(commit_interval_s * 1000)),
        **connect_peer.catalog_properties(settings),
        "iceberg.kafka.bootstrap.servers": bootstrap,
    }


def ratios(ours_run: dict[str, Any], connect_run: dict[str, Any]) -> dict[str, float]:
    """fanout_sink's wall, CPU and peak RSS as shares of Connect's."""
    return {
        "wall": round(ours_run["wall_s"] / connect_run["wall_s"], 3),
        "cpu": round(ours_run["cpu_s"] / connect_run["cpu_s"], 3),
        "rss": round(ours_run["peak_rss_mb"] / connect_run["peak_rss_mb"], 3),
    }


def verdicts(shares: dict[str, float]) -> dict[str, bool]:
    """Each share against issue 50's target (:data:`TARGETS`): met when at most the target."""
    return {key: shares[key] <= target for key, target in TARGETS.items()}


_SESSION_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO fanout_sink\.spark\.session: Spark session ready in "
    r"[\d.]+s \((.*)\)$",
    re.MULTILINE,
)
_ARCHIVE_WORDS = (("mapped", "mapped"), ("refused", "refused"), ("dumping", "dumping"), ("no class", "none"))


def class_archive(log: str) -> str | None:
    """What fanout_sink's driver JVM did with its class archive, from the session's start line."""
    found = _SESSION_LINE.search(log)
    if found is None:
        return None
    return next((word for part, word in _ARCHIVE_WORDS if part in found.group(2)), found.group(2))


def phases(log: str, started_at: float) -> dict[str, float]:
    """Where fanout_sink's wall went, from its log: start to the Spark session, to the first record
    batch's start, the batches' seconds, start to the final commit round's line."""
    out: dict[str, float] = {}
    session = _SESSION_LINE.search(log)
    if session is not None:
        ready = datetime.strptime(session.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out["to_session_s"] = round(ready - started_at, 1)
    first = ours.first_batch_started(log)
    if first is not None:
        out["to_first_batch_s"] = round(first - started_at, 1)
    batches = ours.timed_batches(log)
    if batches:
        out["batches_s"] = round(sum(seconds for _, _, seconds in batches), 1)
    final = many_topics.final_commit_at(log)
    if final is not None:
        out["to_final_commit_s"] = round(final - started_at, 1)
    return out


@dataclass(frozen=True)
class Input:
    """The topics both systems read and what each table must hold."""

    prefix: str
    expected: dict[str, set[int]]
    produce_s: float


def prepare_catalog(folder: Path) -> CatalogSettings:
    """A fresh SQLite catalog in ``folder`` holding only the namespace ``db``."""
    folder.mkdir(parents=True)
    settings = catalog_settings(folder)
    load_catalog(settings).create_namespace(many_topics.NAMESPACE)
    return settings


def _ours_command(
    name: str, data: Input, bootstrap: str, folder: Path, args: argparse.Namespace
) -> list[str]:
    config = ours_config(
        name, data.prefix, bootstrap, catalog_settings(folder), folder, args.cores, args.commit_interval
    )
    path = folder / "sink.yaml"
    path.write_text(yaml.safe_dump(config))
    return ours.app_command(path, f"local[{args.cores}]", None, ["--available-now"])


def _connect_command(
    name: str, data: Input, bootstrap: str, folder: Path, args: argparse.Namespace
) -> list[str]:
    connector = connector_config(
        name, data.prefix, bootstrap, catalog_settings(folder), args.cores, args.commit_interval
    )
    connect_peer.create_control_topic(bootstrap, connector["iceberg.control.topic"])
    return connect_peer.standalone_command(
        folder, bootstrap, args.commit_interval, connector, args.connect_heap
    )


def run_system(
    key: str, data: Input, bootstrap: str, folder: Path, args: argparse.Namespace
) -> SystemFigures:
    """One system from a fresh catalog until every table holds its rows, then every id checked."""
    settings = prepare_catalog(folder)
    name = f"{key}-{uuid.uuid4().hex[:6]}"
    command = (_ours_command if key == "ours" else _connect_command)(name, data, bootstrap, folder, args)
    system = OURS if key == "ours" else connect_peer.SYSTEM
    counts = {table: len(ids) for table, ids in data.expected.items()}
    watch = Watch(VisibleRows(folder / "catalog.db", CATALOG_NAME), counts, sample_s=5.0, poll_s=POLL_S)
    log = folder / ("app.log" if key == "ours" else connect_peer.LOG)
    load_start = os.getloadavg()
    child = run_child(
        command, env=child_env(), log=log, done=watch, timeout_s=args.timeout, usage=watch.usage
    )
    load_end = os.getloadavg()
    watch.poll()
    if not watch.drained():
        raise child.failure(system, log, "exited before every row was visible")
    exact, problems = many_topics.check_tables(settings, data.expected)
    records = sum(counts.values())
    return SystemFigures(
        system=system,
        wall_s=round(child.wall_s, 1),
        first_visible_s=watch.first_visible_s,
        records_per_s=round(records / child.wall_s),
        cpu_s=round(child.cpu_s, 1),
        peak_rss_mb=round(child.peak_rss_mb),
        role_cpu_s={k: round(v, 1) for k, v in child.role_cpu_s.items()},
        role_rss_mb={k: round(v) for k, v in child.role_rss_mb.items()},
        tables_exact=exact,
        problems=problems,
        load_start=load_start,
        load_end=load_end,
        phases=phases(child.stderr, watch.started_at) if key == "ours" else {},
        class_archive=class_archive(child.stderr) if key == "ours" else None,
    )


def produce_input(bootstrap: str, topics: int, events: int) -> Input:
    prefix = f"mt{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}.t{i}" for i in range(topics)]
    many_topics.create_topics(bootstrap, names)
    produce_s, expected = many_topics.produce(bootstrap, names, events, qualified=True)
    return Input(prefix, expected, round(produce_s, 1))


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or "unknown"


def markdown_run(key: str, run: dict[str, Any]) -> str:
    """One run of the JSON as a markdown section: each system's figures, then the shares and targets."""
    lines = [
        f"### {key}",
        "",
        f"`{run['command']}`",
        "",
        f"{run['topics']} one-partition topics, {run['events']:,} JSON events produced in "
        f"{run['produce_s']:.0f} s before either system started; main at {run['commit']}; commit interval "
        f"{run['commit_interval_s']:g} s; local[{run['cores']}] / tasks.max {run['cores']}"
        + (f"; the peer: {run['peer']}." if run.get("peer") else "."),
        "",
        "| system | wall s (start to every table at its rows) | first table visible s | records/s | CPU s "
        "| peak RSS tree MB | tables exact | load avg start / end |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for s in run["systems"]:
        first = "-" if s["first_visible_s"] is None else f"{s['first_visible_s']:.1f}"
        lines.append(
            f"| {s['system']} | {s['wall_s']:.1f} | {first} | {s['records_per_s']:,} | {s['cpu_s']:.1f} | "
            f"{s['peak_rss_mb']:,} | {s['tables_exact']}/{run['topics']} | "
            f"{s['load_start'][0]:.1f} / {s['load_end'][0]:.1f} |"
        )
    lines.append("")
    for s in run["systems"]:
        if s["phases"]:
            lines.append(
                f"{s['system']}'s wall, from its log: "
                + ", ".join(
                    f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in s["phases"].items()
                )
                + (f"; class archive {s['class_archive']}" if s.get("class_archive") else "")
                + "; CPU s by process kind: "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(s["role_cpu_s"].items()))
                + "."
            )
    if run.get("ratios"):
        met = verdicts(run["ratios"])
        lines += ["", "| target (fanout_sink / Connect) | share | verdict |", "|---|---:|---|"]
        for what, target in TARGETS.items():
            verdict = "met" if met[what] else "**NOT met**"
            lines.append(f"| {LABELS[what]} at most {target:g}x | {run['ratios'][what]:.2f}x | {verdict} |")
    return "\n".join([*lines, ""])


def write_markdown(path: Path, runs: dict[str, Any]) -> None:
    """Render every run below :data:`MARKER`, keeping what is written above it."""
    body = "\n".join(markdown_run(key, run) for key, run in runs.items())
    render_below(path, MARKER, "300 tables side by side", body)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated of ours, connect; in order"
    )
    parser.add_argument("--cores", type=int, default=2, help="local[N]; Connect's tasks.max")
    parser.add_argument("--commit-interval", type=float, default=10.0, help="seconds, for both systems")
    parser.add_argument("--connect-heap", default="2g", help="the Connect peer's -Xmx")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a system may take")
    parser.add_argument("--bootstrap-servers", help="default: the local stack's broker (started when down)")
    parser.add_argument("--out", type=Path, help=f"{JSON_NAME} and the .md page there (default: none)")
    parser.add_argument("--work-dir", type=Path, help="run folders, kept (default: a temporary folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keys, bootstrap, command = start_systems(
        argv, "bench.many_topics_side_by_side", args.systems, SYSTEMS, args.bootstrap_servers
    )
    data = produce_input(bootstrap, args.topics, args.events)
    print(f"{args.topics} topics, {args.events:,} events produced in {data.produce_s:.1f} s", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="many-side-"))
    figures: list[SystemFigures] = []
    try:
        for key in keys:
            done = run_system(key, data, bootstrap, work / key, args)
            figures.append(done)
            print(
                f"{done.system}: {done.wall_s:.1f} s to every table ({done.records_per_s:,} records/s), "
                f"{done.cpu_s:.1f} CPU s, peak RSS {done.peak_rss_mb:,} MB, "
                f"{done.tables_exact}/{args.topics} tables exact {done.phases or ''}",
                flush=True,
            )
    finally:
        admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
        names = [f"{data.prefix}.t{i}" for i in range(args.topics)]
        for future in admin.delete_topics(names).values():
            future.result(timeout=60)
    run: dict[str, Any] = {
        "command": command,
        "commit": _commit(),
        "topics": args.topics,
        "events": args.events,
        "produce_s": data.produce_s,
        "commit_interval_s": args.commit_interval,
        "cores": args.cores,
        "machine": machine_facts(),
        "peer": (
            f"Kafka Connect {connect_peer.kafka_version()}, Iceberg {connect_peer.iceberg_version()}"
            if "connect" in keys
            else None
        ),
        "systems": [asdict(f) for f in figures],
    }
    by_system = {f.system: asdict(f) for f in figures}
    if OURS in by_system and connect_peer.SYSTEM in by_system:
        run["ratios"] = ratios(by_system[OURS], by_system[connect_peer.SYSTEM])
    key = f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {args.topics} tables ({', '.join(keys)})"
    if args.out is not None:
        path = args.out / JSON_NAME
        runs: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        runs[key] = run
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(runs, indent=1) + "\n")
        write_markdown(args.out / JSON_NAME.replace(".json", ".md"), runs)
    print(markdown_run(key, run))
    problems = [p for f in figures for p in f.problems]
    for problem in problems[:20]:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
