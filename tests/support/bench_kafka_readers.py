"""Read the same committed records with the sink's reader and with Arrow-native Kafka readers from PyPI.

    PYTHONPATH=. .venv/bin/python tests/support/bench_kafka_readers.py [--records 1000000]

A broker of its own (the stack's, in a temporary folder); N JSON records of ~140 B over 4 partitions,
produced in transactions of 50,000 (so read_committed has markers to skip), lz4. Each reader reads
them all twice; wall, process CPU (its librdkafka threads included) and CPU per record are printed.

- ``RangeReader``: the sink's (confluent-kafka: one Python ``Message`` per record, then Arrow columns),
  exact ``[start, end)`` ranges per partition, read_committed.
- ``kafkarrow`` (PyPI, Rust over librdkafka, Arrow batches), when installed in the virtualenv
  (``pip install kafkarrow``; not a dependency): it starts at earliest, latest or a time only, merges
  partitions in timestamp order and has no header column, so it reads the topic, not our ranges.
  Results and the verdict: docs/benchmarks/readers.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.range_reader import RangeReader

TOPIC, PARTITIONS, TRANSACTION = "readers", 4, 50_000
VALUE = (
    b'{"type":"order","id":%d,"amount":12.5,"customer":{"id":"c-1","tier":"gold"},"status":"paid",'
    b'"note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'
)


def produce(bootstrap: str, records: int) -> dict[int, int]:
    """The records in transactions; each partition's end offset (markers included)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(60)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "readers",
            "linger.ms": 20,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions(60)
    for first in range(0, records, TRANSACTION):
        producer.begin_transaction()
        for i in range(first, min(records, first + TRANSACTION)):
            producer.produce(TOPIC, VALUE % i, key=b"k%d" % i, partition=i % PARTITIONS)
            if i % 10_000 == 0:
                producer.poll(0)
        producer.commit_transaction(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readers-ends"})
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)
    }
    consumer.close()
    return ends


def range_reader(bootstrap: str, ends: dict[int, int], records: int) -> int:
    reader = RangeReader(KafkaClientFactory({"bootstrap.servers": bootstrap}), "readers-bench")
    rows = sum(
        chunk.num_rows for p, end in ends.items() for chunk in reader.read_chunks(TOPIC, p, 0, end, 50_000)
    )
    reader.close()
    return rows


def kafkarrow_reader(bootstrap: str, ends: dict[int, int], records: int) -> int:
    import kafkarrow  # type: ignore[import-not-found]

    manager = kafkarrow.ConsumerManager(
        config={
            "bootstrap.servers": bootstrap,
            "group.id": "readers-kafkarrow",
            "isolation.level": "read_committed",
        },
        topics=[kafkarrow.SourceTopic.from_earliest(TOPIC)],
        batch_size=50_000,
    )
    rows = 0
    while rows < records:
        rows += manager.poll(timeout_ms=1000).num_rows
    return rows


def measure(name: str, read: Callable[[], int]) -> None:
    for run in (1, 2):
        cpu, wall = time.process_time(), time.monotonic()
        rows = read()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        rate, per_record = rows / wall, 1e6 * cpu / rows
        print(f"{name} (run {run}): {rows:,} rows, {wall:.2f} s wall, {cpu:.2f} s CPU, "
              f"{rate:,.0f} records/s, {per_record:.2f} CPU us per record", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="readers-")))
    broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        ends = produce(bootstrap, args.records)
        print(f"{args.records:,} records over {PARTITIONS} partitions, ends {ends}", flush=True)
        measure("RangeReader (confluent-kafka)", lambda: range_reader(bootstrap, ends, args.records))
        try:
            import kafkarrow  # noqa: F401
        except ImportError:
            print("kafkarrow: not installed (pip install kafkarrow)")
        else:
            measure("kafkarrow (batch_size 50,000)", lambda: kafkarrow_reader(bootstrap, ends, args.records))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
