"""End-to-end throughput of the app next to the in-process limit of the same work.

    PYTHONPATH=tests python -m bench.end_to_end --records 1000000 --out bench-e2e.md
    PYTHONPATH=tests python -m bench.end_to_end --records 200000 --tables 50 --out bench-50.md

It produces the records to a fresh topic (2 partitions) on the local broker (or
``--bootstrap-servers``), then measures:

- *in-process limit*: the same records as raw slices through decode + route + convert
  (``build_processor``) and the worker's Parquet writer, in this process: no Kafka, no Spark;
- *end to end*: ``fanout-sink run --available-now`` in a child process, from start to exit (Spark
  start-up included) and the sum of its micro-batch times (steady state), with the peak RSS of
  the Python workers that ran the slices, and its CPU seconds per process role (driver JVM, Python
  workers, driver Python; sampled from ``/proc``).

``--tables 3`` routes shop events to orders/payments/clicks; ``--tables N`` (N > 3) spreads uniform
click-like records over N dynamic tables. Throughput counts input records and input value bytes.
Results go to stdout and, as a markdown table, to ``--out``.
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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.cimpl import NewTopic
from support.raw_slices import make_raw_slice

from bench.process_cpu import ProcessTreeCpu
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.devtools.sample_data import shop_events
from fanout_sink.devtools.stack import daemon
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.protocol import datafiles
from fanout_sink.transform.processor import build_processor

PARTITIONS = 2
_BATCH_LINE = re.compile(
    r"batch \d+: (\d+) records in.*\((\d+\.\d+)s, \d+ slices, peak worker RSS (\d+) MB\)"
)


def _values(records: int, tables: int) -> list[bytes]:
    if tables == 3:
        return [event.value for event in shop_events(records)]
    return [
        json.dumps(
            {"id": f"e-{n}", "shard": n % tables, "session": f"s-{n % 977}", "page": "/p", "ms": n}
        ).encode()
        for n in range(records)
    ]


def _config(
    name: str, topic: str, bootstrap: str, settings: CatalogSettings, folder: Path, tables: int
) -> Any:
    data: dict[str, Any] = {
        "name": name,
        "kafka": {"bootstrap.servers": bootstrap},
        "source": {"topics": [topic], "format": "json"},
        "control": {"topic": f"{name}-control", "commit-interval": "30s"},
        "catalog": settings.model_dump(),
        "spark": {"master": "local[2]", "checkpoint-location": str(folder / "checkpoints")},
    }
    if tables == 3:
        data["tables"] = {
            f"bench.{kind}s": {"when": f"type == '{kind}'"} for kind in ("order", "payment", "click")
        }
    else:
        data["dynamic"] = {
            "table": "join('', ['bench.t', to_string(shard)])",
            "allow": "^bench\\.t[0-9]+$",
            "auto-create": True,
            "applies-to": "all",
        }
    return data


def produce(bootstrap: str, topic: str, values: list[bytes]) -> float:
    """Seconds to create ``topic`` and produce ``values``: value n to partition n % PARTITIONS."""
    return produce_chunks(bootstrap, topic, [(None, values)])


def produce_chunks(
    bootstrap: str,
    topic: str,
    chunks: Iterable[tuple[list[bytes] | None, list[bytes]]],
    partitions: int = PARTITIONS,
) -> float:
    """Seconds to create ``topic`` of ``partitions`` and produce each chunk's values in order. A chunk
    without keys goes round-robin (value n to partition n % partitions); with keys, the producer's
    partitioner places each message by its key, so a key's messages stay in one partition, in order."""
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {"linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4"}
    )
    started = time.monotonic()
    for keys, values in chunks:
        for n, value in enumerate(values):
            while True:
                try:
                    if keys is None:
                        producer.produce(topic, value=value, partition=n % partitions)
                    else:
                        producer.produce(topic, value=value, key=keys[n])
                    break
                except BufferError:
                    producer.poll(0.1)
    if producer.flush(120):
        raise TimeoutError(f"producing to {topic}: messages still undelivered after 120 s; is the broker up?")
    return time.monotonic() - started


def in_process_limit(config: Any, values: list[bytes]) -> float:
    """Seconds for decode + route + convert + Parquet write of every record, slice by slice."""
    catalog = load_catalog(config.catalog)
    process = build_processor(config, catalog)
    slice_size = 100_000
    slices = [
        make_raw_slice(values[i : i + slice_size], topic="bench", partition=0, start_offset=i)
        for i in range(0, len(values), slice_size)
    ]
    for table_rows in process(slices[0].slice(0, 1000)).tables.values():  # create tables untimed
        datafiles.write_data_files(table_rows.table, table_rows.rows.slice(0, 1))
    started = time.monotonic()
    for raw in slices:
        for table_rows in process(raw).tables.values():
            datafiles.write_data_files(table_rows.table, table_rows.rows)
    return time.monotonic() - started


def end_to_end(config_path: Path) -> tuple[float, float, int, int, dict[str, float]]:
    """(wall seconds, sum of batch seconds, records reported, peak worker RSS MB, CPU seconds per
    process role) of one run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    started = time.monotonic()
    app = subprocess.Popen(
        [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(config_path), "--available-now",
         "--max-offsets-per-trigger", "400000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    cpu = ProcessTreeCpu(app.pid)
    _, stderr = app.communicate()
    cpu.stop()
    wall = time.monotonic() - started
    if app.returncode != 0:
        raise SystemExit(f"the app failed:\n{stderr[-4000:]}")
    batches = [(int(a), float(b), int(c)) for a, b, c in _BATCH_LINE.findall(stderr)]
    return (
        wall,
        sum(b[1] for b in batches),
        sum(b[0] for b in batches),
        max((b[2] for b in batches), default=0),
        cpu.by_role(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--out", type=Path, default=Path("bench-e2e.md"))
    args = parser.parse_args(argv)
    bootstrap = args.bootstrap_servers or daemon.up(daemon.default_dir())[0].bootstrap_servers
    folder = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    run = uuid.uuid4().hex[:6]
    values = _values(args.records, args.tables)
    megabytes = sum(len(v) for v in values) / 1e6

    limit_settings = CatalogSettings(name="bench_limit", uri=f"sqlite:///{folder / 'limit.db'}",
                                     warehouse=f"file://{folder / 'limit-warehouse'}")  # fmt: skip
    limit_config = parse_config(
        _config(f"limit-{run}", "bench", bootstrap, limit_settings, folder, args.tables)
    )
    limit_s = in_process_limit(limit_config, values)

    topic = f"bench-{run}"
    produce_s = produce(bootstrap, topic, values)
    settings = CatalogSettings(name="bench", uri=f"sqlite:///{folder / 'e2e.db'}",
                               warehouse=f"file://{folder / 'e2e-warehouse'}")  # fmt: skip
    config_path = folder / "sink.yaml"
    config_path.write_text(
        yaml.safe_dump(_config(f"bench-{run}", topic, bootstrap, settings, folder, args.tables))
    )
    del values
    wall_s, batches_s, reported, peak_rss, cpu = end_to_end(config_path)
    catalog = load_catalog(settings)
    landed = [".".join(identifier) for identifier in catalog.list_tables("bench")]
    rows = sum(len(catalog.load_table(t).scan(selected_fields=("id",)).to_arrow()) for t in landed)
    assert reported == args.records, f"the app reported {reported} records, {args.records} were produced"

    def rate(seconds: float) -> str:
        return f"{args.records / seconds:,.0f} | {megabytes / seconds:.1f}"

    lines = [
        f"{args.records:,} records ({megabytes:.1f} MB of JSON values), {args.tables} tables, "
        f"{PARTITIONS} partitions, local[2] on {os.cpu_count()} cores; {rows:,} rows landed",
        "",
        "| path | seconds | records/s | MB/s |",
        "|---|---:|---:|---:|",
        f"| in-process limit (no Kafka, no Spark) | {limit_s:.1f} | {rate(limit_s)} |",
        f"| end to end, steady state (sum of micro-batch times) | {batches_s:.1f} | {rate(batches_s)} |",
        f"| end to end, wall (Spark start-up and final commit included) | {wall_s:.1f} | {rate(wall_s)} |",
        f"| producing the input (not part of the sink) | {produce_s:.1f} | {rate(produce_s)} |",
        "",
        f"steady state = {100 * limit_s / batches_s:.0f}% of the in-process limit; "
        f"peak Python worker RSS {peak_rss} MB",
        "",
        f"app CPU seconds per 1M records: {1e6 * sum(cpu.values()) / args.records:.1f} = "
        + ", ".join(f"{role} {1e6 * seconds / args.records:.1f}" for role, seconds in cpu.items()),
    ]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
