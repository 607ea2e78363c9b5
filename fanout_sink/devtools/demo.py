"""The README's first command: sample shop events through the real sink app into Iceberg tables.

It produces realistic orders, payments and clicks (plus a few malformed records) to two topics on
the local broker, runs the streaming app once with ``--available-now`` on ``routing/shop-demo.yaml``,
and then shows what landed: rows through PyIceberg and through Spark SQL (Iceberg's JDBC catalog on
the same SQLite file), the snapshot summaries the sink wrote, each table's VTTS, and the dead letters.
It leaves the config it ran, resolved, beside the tables (``<dir>/sink.yaml``) and ends with the
``fanout-sink status`` and ``fanout-sink sql`` commands that show them from any shell.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.cimpl import NewTopic

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config, write_standalone_copy
from fanout_sink.config.models import SinkConfig
from fanout_sink.devtools.sample_data import shop_events
from fanout_sink.devtools.stack import daemon
from fanout_sink.devtools.topics import header_pairs, read_to_end
from fanout_sink.kafka.clients import KafkaClientFactory, retry_transient
from fanout_sink.protocol import table_state
from fanout_sink.spark.app import RunOptions, SinkApp
from fanout_sink.transform.deadletter import header
from fanout_sink.transform.records import DeadLetter

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "routing" / "shop-demo.yaml"
TOPICS = {"orders": 3, "clicks": 2}
DEMO_VARIABLES = ("KAFKA_BOOTSTRAP", "FANOUT_SINK_DEMO_DIR")
"""The variables the demo sets for its config; the copy it leaves holds their values."""


def malformed_events(run: int) -> list[tuple[str, bytes]]:
    """Records a real feed also carries; each must end up in the dead-letter topic, not lost."""
    bad_customer = b'{"type":"order","id":"order-bad-customer-%d","customer":{"id":"n/a"},"ts":"2026-01-01"}'
    return [
        ("orders", b'{"type":"order","id":"order-truncated-%d","customer":' % run),
        ("orders", bad_customer % run),
        ("orders", b'{"type":"order","id":"order-no-ts-%d","customer":{"id":7},"amount":"3.50"}' % run),
        ("clicks", b'{"type":"refund","id":"refund-%d"}' % run),
        ("clicks", b"\xff\xfe not utf-8 %d" % run),
    ]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ensure_topics(bootstrap: str, names: dict[str, int]) -> None:
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    existing = set(admin.list_topics(timeout=30).topics)
    missing = [NewTopic(name, parts, 1) for name, parts in names.items() if name not in existing]
    for future in admin.create_topics(missing).values() if missing else []:
        future.result(timeout=30)


def _end_offsets(bootstrap: str, topics: dict[str, int]) -> int:
    """Records ever written to the demo topics: the next run numbers its events after them."""
    consumer = KafkaClientFactory({"bootstrap.servers": bootstrap}).consumer(
        {"group.id": "fanout-sink-demo-probe"}
    )

    def high(topic: str, partition: int) -> int:
        low_high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        return int(low_high[1]) if low_high else 0

    try:
        total = 0
        for topic, count in topics.items():
            for part in range(count):
                total += retry_transient(functools.partial(high, topic, part))
        return total
    finally:
        consumer.close()


def _produce(bootstrap: str, records: int, start: int) -> int:
    producer = KafkaClientFactory({"bootstrap.servers": bootstrap}).producer(
        {"transactional.id": "fanout-sink-demo-producer"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for event in shop_events(records, start=start):
        producer.produce(event.topic, key=event.key, value=event.value)
        producer.poll(0)
    bad = malformed_events(start)
    for topic, value in bad:
        producer.produce(topic, value=value)
    producer.commit_transaction(60)
    return len(bad)


def _dead_letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    letters = []
    for msg in read_to_end(bootstrap, [topic]):
        letters.append(DeadLetter(key=msg.key(), value=msg.value(), headers=header_pairs(msg)))
    return letters


def _when(ms: int | None) -> str:
    return "unknown" if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def show(config: SinkConfig, bootstrap: str) -> None:
    catalog = load_catalog(config.catalog)
    print("\n== through PyIceberg ==")
    for name in config.tables:
        table = catalog.load_table(name)
        data = table.scan().to_arrow()
        state = table_state.read_state(table, config.name)
        print(f"{config.catalog.name}.{name}: {data.num_rows} rows, {len(table.snapshots())} snapshots, "
              f"VTTS {_when(state.vtts_ms)}")  # fmt: skip
        print(data.slice(0, 3).to_pandas().to_string(index=False, max_colwidth=40))

    print(
        "\n== through Spark SQL (what `fanout-sink sql` prints; Iceberg's JDBC catalog on the same file) =="
    )
    from fanout_sink.spark.session import build_spark_session
    from fanout_sink.spark.sql_shell import Shell

    spark = build_spark_session(config.catalog, app_name="fanout-sink-demo")
    lake = config.catalog.name
    prefix = f"fanout-sink.{config.name}"
    shell = Shell(spark)
    for statement in (
        "SELECT country, count(*) AS orders, sum(amount) AS revenue "
        f"FROM {lake}.shop.orders GROUP BY country ORDER BY revenue DESC LIMIT 5",
        f"SELECT method, count(*) AS payments FROM {lake}.shop.payments GROUP BY method ORDER BY method",
        f"SELECT snapshot_id, summary['added-records'] AS added, summary['{prefix}.commit-id'] AS commit_id, "
        f"summary['{prefix}.control-offsets'] AS control_offsets, summary['{prefix}.vtts'] AS vtts "
        f"FROM {lake}.shop.orders.snapshots ORDER BY committed_at",
    ):
        print()
        shell.run_one(statement)

    if config.dead_letter is not None:
        letters = _dead_letters(bootstrap, config.dead_letter.topic)
        print(f"\n== dead-letter topic {config.dead_letter.topic}: {len(letters)} records ==")
        for letter in letters[-5:]:
            where = [
                header(letter, f"fanout-sink.source.{part}") for part in ("topic", "partition", "offset")
            ]
            source = f"{where[0]}[{where[1]}]@{where[2]}"
            print(
                f"  {source}: {header(letter, 'fanout-sink.stage')}: {header(letter, 'fanout-sink.reason')}"
            )


def run(
    work_dir: Path, records: int = 2000, bootstrap_servers: str | None = None, config_path: Path | None = None
) -> int:
    """Run the demo against ``bootstrap_servers``, or against the local stack (started when down)."""
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    if bootstrap_servers is None:
        state, started = daemon.up(daemon.default_dir())
        bootstrap_servers = state.bootstrap_servers
        _say(f"Kafka broker {'started' if started else 'running'} at {bootstrap_servers}")
    os.environ["KAFKA_BOOTSTRAP"] = bootstrap_servers
    os.environ["FANOUT_SINK_DEMO_DIR"] = str(work_dir)
    # The config the demo runs, resolved beside its tables: the commands printed at the end use it.
    config_file = write_standalone_copy(config_path or DEFAULT_CONFIG, work_dir / "sink.yaml", DEMO_VARIABLES)
    config = load_config(config_file)
    topics = dict(TOPICS)
    if config.dead_letter is not None:
        topics[config.dead_letter.topic] = 1
    _ensure_topics(bootstrap_servers, topics)
    start = _end_offsets(bootstrap_servers, TOPICS)
    bad = _produce(bootstrap_servers, records, start)
    _say(f"produced {records} sample events and {bad} malformed records to {', '.join(TOPICS)}; "
         f"running sink {config.name!r} with --available-now")  # fmt: skip
    SinkApp(config, RunOptions(available_now=True)).run()
    show(config, bootstrap_servers)
    print(closing_lines(work_dir, config_file, config))
    return 0


def _cli() -> str:
    """The ``fanout-sink`` beside this interpreter, by its absolute path: the bootstrap's virtualenv
    is on no new shell's PATH, so a bare ``fanout-sink`` would not be found there."""
    beside = Path(sys.executable).with_name("fanout-sink")  # not resolved: a venv's python is a link
    return str(beside) if beside.exists() else "fanout-sink"


def closing_lines(work_dir: Path, config_file: Path, config: SinkConfig) -> str:
    """Where the tables are and the exact commands that show them, runnable as printed from any
    folder in a new shell (the config beside the tables needs none of the demo's variables)."""
    first = next(iter(config.tables), None)
    query = f"SELECT * FROM {first} LIMIT 5" if first else "SHOW NAMESPACES"
    cli = _cli()
    status = shlex.join([cli, "status", "--config", str(config_file)])
    sql = shlex.join([cli, "sql", "--config", str(config_file), "-e", query])
    return (
        f"\nTables live in {work_dir}, beside the config that wrote them ({config_file.name}). "
        f"Lag, commits and VTTS:\n  {status}\nThe rows, through Spark SQL:\n  {sql}"
    )
