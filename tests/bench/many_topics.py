"""A whole database's topics: N one-partition topics, a topic pattern, N dynamic tables, one SIGKILL.

``PYTHONPATH=tests python -m bench.many_topics --topics 300 --events 60000 --kill-after 60
--bootstrap-servers HOST:PORT``

The shape of issue 32's whole-database run (a Debezium connector writes one topic per table): it
creates ``--topics`` topics ``<prefix>.t<i>`` of one partition each, produces ``--events`` JSON events
spread evenly over them (event ``n`` to topic ``n % topics``, with ``tbl`` naming its table and a
unique ``id``), and runs ``fanout-sink run --available-now`` over ``source.pattern`` with
``dynamic.table`` + auto-create into a fresh embedded (SQLite) catalog. After ``--kill-after`` seconds
it SIGKILLs the app's whole process group (driver, JVM, Python workers), then restarts it and times
the restart until it exits: the drain that issue 32 measured at 315 s before partition packing. It
prints the restart's records/s, its batch lines' slices and the partition groups (Spark tasks per
batch: one per group that has data), then reads every table through PyIceberg and requires its ids
exactly (none missing, none twice).

With ``--changes`` the topics carry Debezium change events instead (plain JSON ``op``/``before``/
``after``/``source``, keyed by ``{"id": ...}`` as Debezium keys by primary key): each topic's events
create, update and delete rows of its own small key space, ``dynamic.table`` names the table from
``source.table`` and ``dynamic.changes: {format: debezium}`` makes every table a change table keyed by
the message key. The check then requires each table to hold exactly the keys still alive, each with
the ``name`` of its last change: issue 32's whole-database CDC run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.cimpl import NewTopic

from bench import ours
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.kafka.clients import KafkaClientFactory

NAMESPACE = "db"
_BATCH_LINE = re.compile(r"batch (\d+): (\d+) records in.*\((\d+\.\d+)s, (\d+) slices, peak worker RSS")
_FINAL_COMMIT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ fanout_sink\.app: final commit round", re.M
)


@dataclass
class Batch:
    batch: int
    records: int
    seconds: float
    slices: int


@dataclass
class RunFigures:
    """One app run: its wall until exit (or the kill), its batches and partition groups."""

    wall_s: float
    final_commit_s: float | None
    """From start to the log's final commit round: every table holds its rows; Spark's shutdown follows."""
    killed: bool
    exit_code: int
    groups: int | None
    batches: list[Batch] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(b.records for b in self.batches)


@dataclass
class ManyTopicsResult:
    topics: int
    events: int
    kill_after_s: float
    produce_s: float
    first: RunFigures
    restart: RunFigures
    tables_exact: int
    problems: list[str]
    changes: bool = False
    """Debezium change events into change tables (``--changes``), not appends."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def create_topics(bootstrap: str, names: list[str]) -> None:
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in names]).values():
        future.result(timeout=60)


def send_all(bootstrap: str, messages: Iterable[tuple[str, bytes | None, bytes]]) -> float:
    """Seconds to produce every ``(topic, key, value)`` and flush. The producer is idempotent, which
    keeps each partition in produce order across retries: a freshly created topic's first batch can
    fail retriably (its leader not yet known) and, without it, land after later ones, so a key's last
    change would not be last on its topic (seen: 10 of 1,000 topics)."""
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {"linger.ms": 20, "compression.type": "lz4", "enable.idempotence": True}
    )
    started = time.monotonic()
    for topic, key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise TimeoutError("events still undelivered after 120 s; is the broker up?")
    return time.monotonic() - started


def produce(
    bootstrap: str, topics: list[str], events: int, qualified: bool = False
) -> tuple[float, dict[str, set[int]]]:
    """Seconds to produce ``events`` events over ``topics``, and each table's expected ids.
    ``qualified``: ``tbl`` holds the whole table name (``db.t7``, as the Connect sink's dynamic
    routing takes it), not only the table's own (``t7``)."""
    expected: dict[str, set[int]] = {}

    def messages() -> Iterator[tuple[str, bytes | None, bytes]]:
        for n in range(events):
            i = n % len(topics)
            table = f"{NAMESPACE}.t{i}"
            route = table if qualified else f"t{i}"
            value = {"id": n, "tbl": route, "op": "c", "name": f"row-{n}", "amount": n % 1000 / 10}
            expected.setdefault(table, set()).add(n)
            yield topics[i], None, json.dumps(value).encode()

    return send_all(bootstrap, messages()), expected


KEYS_PER_TABLE = 20
"""A change stream's key space per table: small, so that most events update or delete a live row."""


def produce_changes(
    bootstrap: str, topics: list[str], events: int
) -> tuple[float, dict[str, dict[int, str]]]:
    """Seconds to produce ``events`` Debezium change events over ``topics``, and each table's final
    state (key -> the ``name`` of its last change; deleted keys absent). Event ``n`` goes to topic
    ``n % topics``; a key not alive is created, a live one updated (70 %) or deleted (30 %)."""
    rng = random.Random(32)
    state: dict[str, dict[int, str]] = {f"{NAMESPACE}.t{i}": {} for i in range(len(topics))}

    def messages() -> Iterator[tuple[str, bytes | None, bytes]]:
        for n in range(events):
            i = n % len(topics)
            rows = state[f"{NAMESPACE}.t{i}"]
            key = i * KEYS_PER_TABLE + rng.randrange(KEYS_PER_TABLE)
            before = {"id": key, "name": rows[key], "amount": 0.0} if key in rows else None
            name = f"v{n}"
            after = {"id": key, "name": name, "amount": n % 1000 / 10}
            op = "c" if before is None else ("u" if rng.random() < 0.7 else "d")
            event = {
                "op": op,
                "before": before,
                "after": None if op == "d" else after,
                "source": {"db": "shop", "table": f"t{i}", "lsn": n},
                "ts_ms": 1_700_000_000_000 + n,
            }
            if op == "d":
                del rows[key]
            else:
                rows[key] = name
            yield topics[i], json.dumps({"id": key}).encode(), json.dumps(event).encode()

    return send_all(bootstrap, messages()), state


def topic_pattern(prefix: str) -> str:
    """The regex matching the run's topics ``<prefix>.t<i>`` (``source.pattern``, ``topics.regex``)."""
    return f"{re.escape(prefix)}\\.t[0-9]+"


def final_commit_at(log: str) -> float | None:
    """When the app's log says its final commit round ran (epoch seconds): every table holds its rows."""
    final = _FINAL_COMMIT.search(log)
    return datetime.strptime(final.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if final else None


def sink_config(
    name: str, prefix: str, bootstrap: str, settings: CatalogSettings, folder: Path, changes: bool = False
) -> dict[str, Any]:
    if changes:
        dynamic: dict[str, Any] = {
            "table": f"join('.', ['{NAMESPACE}', source.table])",
            "changes": {"format": "debezium"},
        }
    else:
        dynamic = {"table": f"join('.', ['{NAMESPACE}', tbl])"}
    return {
        "name": name,
        "kafka": {"bootstrap.servers": bootstrap},
        "source": {"pattern": topic_pattern(prefix), "format": "json"},
        "control": {"topic": f"{name}-control", "commit-interval": "10s"},
        "catalog": settings.model_dump(),
        "spark": {"master": "local[2]", "checkpoint-location": str(folder / "checkpoints")},
        "dynamic": {
            **dynamic,
            "allow": f"^{NAMESPACE}\\.t[0-9]+$",
            "auto-create": True,
            "applies-to": "all",
        },
    }


def run_app(config_path: Path, log_path: Path, kill_after_s: float | None) -> RunFigures:
    """Run the app with ``--available-now`` in its own process group; SIGKILL the group after
    ``kill_after_s`` (None: wait for its exit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    command = [
        sys.executable,
        "-m",
        "fanout_sink.cli",
        "run",
        "--config",
        str(config_path),
        "--available-now",
    ]
    started, started_at = time.monotonic(), time.time()
    with log_path.open("w") as log:
        app = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        killed = False
        try:
            app.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait()
            killed = True
    wall = time.monotonic() - started
    text = log_path.read_text()
    final_at = final_commit_at(text)
    return RunFigures(
        wall_s=round(wall, 1),
        final_commit_s=round(final_at - started_at, 1) if final_at is not None else None,
        killed=killed,
        exit_code=app.returncode,
        groups=ours.partition_groups(text),
        batches=[Batch(int(b), int(r), float(s), int(n)) for b, r, s, n in _BATCH_LINE.findall(text)],
    )


def check_tables(settings: CatalogSettings, expected: dict[str, set[int]]) -> tuple[int, list[str]]:
    """Tables holding exactly their ids, and what is wrong with the others."""
    catalog = load_catalog(settings)
    exact, problems = 0, []
    for table, ids in sorted(expected.items()):
        got = catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        duplicates = len(got) - len(set(got))
        missing = len(ids - set(got))
        extra = len(set(got) - ids)
        if duplicates or missing or extra:
            problems.append(f"{table}: {duplicates} duplicates, {missing} missing, {extra} unexpected")
        else:
            exact += 1
    return exact, problems


def check_change_tables(
    settings: CatalogSettings, expected: dict[str, dict[int, str]]
) -> tuple[int, list[str]]:
    """Tables holding exactly their live keys, each with its last change's ``name``; what is wrong
    with the others (every table exists: its first event is a create)."""
    catalog = load_catalog(settings)
    exact, problems = 0, []
    for table, rows in sorted(expected.items()):
        got = catalog.load_table(table).scan(selected_fields=("id", "name")).to_arrow().to_pylist()
        ids = [row["id"] for row in got]
        landed = {row["id"]: row["name"] for row in got}
        duplicates = len(ids) - len(landed)
        missing = len(rows.keys() - landed.keys())
        deleted_back = len(landed.keys() - rows.keys())
        stale = sum(1 for key, name in landed.items() if key in rows and rows[key] != name)
        if duplicates or missing or deleted_back or stale:
            problems.append(
                f"{table}: {duplicates} duplicate keys, {missing} missing, "
                f"{deleted_back} deleted but present, {stale} not at their last change"
            )
        else:
            exact += 1
    return exact, problems


def run(
    topics: int, events: int, kill_after_s: float, bootstrap: str, folder: Path, changes: bool = False
) -> ManyTopicsResult:
    run_id = uuid.uuid4().hex[:6]
    prefix = f"mt{run_id}"
    names = [f"{prefix}.t{i}" for i in range(topics)]
    create_topics(bootstrap, names)
    if changes:
        produce_s, state = produce_changes(bootstrap, names, events)
    else:
        produce_s, expected = produce(bootstrap, names, events)
    print(f"{topics} topics created, {events:,} events produced in {produce_s:.1f} s", flush=True)
    settings = CatalogSettings(
        name="bench", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder / 'warehouse'}"
    )
    config_path = folder / "sink.yaml"
    config = sink_config(f"many-{run_id}", prefix, bootstrap, settings, folder, changes)
    config_path.write_text(yaml.safe_dump(config))
    first = run_app(config_path, folder / "first.log", kill_after_s)
    print(f"first run: {'SIGKILLed' if first.killed else 'exited'} after {first.wall_s:.1f} s, "
          f"{first.records:,} records in {len(first.batches)} logged batch(es)", flush=True)  # fmt: skip
    restart = run_app(config_path, folder / "restart.log", None)
    if restart.exit_code != 0:
        raise SystemExit(f"the restart failed ({restart.exit_code}); log in {folder / 'restart.log'}")
    exact, problems = check_change_tables(settings, state) if changes else check_tables(settings, expected)
    return ManyTopicsResult(
        topics, events, kill_after_s, round(produce_s, 1), first, restart, exact, problems, changes
    )


def report(result: ManyTopicsResult) -> str:
    """A markdown table row (with its header) for docs/benchmarks/wide-sinks.md."""
    restart = result.restart
    slices = ", ".join(f"{b.records:,} rec / {b.seconds:.1f} s / {b.slices} slices" for b in restart.batches)
    rate = restart.records / restart.wall_s if restart.wall_s else 0.0
    verdict = "exact" if not result.problems else f"{len(result.problems)} NOT exact"
    return "\n".join(
        [
            "| topics = tables | events | killed after s | restart: final commit s "
            "| restart wall s (to exit) | restart records | records/s (wall) "
            "| partition groups (Spark tasks per batch) | restart batches | tables exact |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
            f"| {result.topics} | {result.events:,} | "
            f"{result.first.wall_s:.0f}{'' if result.first.killed else ' (exited first)'} | "
            f"{restart.final_commit_s} | {restart.wall_s:.1f} | {restart.records:,} | {rate:,.0f} | "
            f"{restart.groups} | {slices} | "
            f"{result.tables_exact}/{result.topics} {verdict} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--kill-after", type=float, default=60.0, help="seconds into the first run")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="kept (logs, catalog); default: a temp dir"
    )
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the figures")
    parser.add_argument("--changes", action="store_true", help="Debezium change events into change tables")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="many-topics-") as scratch:
        folder = args.work_dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        result = run(args.topics, args.events, args.kill_after, args.bootstrap_servers, folder, args.changes)
    print(report(result))
    for problem in result.problems[:20]:
        print(problem)
    if args.out is not None:
        args.out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
