"""Read the same committed records with the sink's reader and with Arrow-native Kafka readers from PyPI.

    PYTHONPATH=. .venv/bin/python tests/support/bench_kafka_readers.py [--records 1000000]
        [--conf fetch.queue.backoff.ms=10 ...]  (librdkafka properties for RangeReader and native)

A broker of its own (the stack's, in a temporary folder); N JSON records of ~140 B over 4 partitions,
produced in transactions of 50,000 (so read_committed has markers to skip), lz4. Each reader reads
them all twice; wall, process CPU (its librdkafka threads included) and CPU per record are printed.

- ``RangeReader``, python: the sink's reader on confluent-kafka's ``consume`` (one Python ``Message``
  per record, then Arrow columns; the fallback), exact ``[start, end)`` ranges per partition.
- ``RangeReader``, native: the same reader on the native consume (``fanout_sink/kafka/librdkafka_arrow.c``,
  built when the project is installed): ``rd_kafka_consume_batch_queue`` on the same consumer,
  straight into Arrow buffers. After the timed runs every partition's range (and an inner one) is
  read once more by both and the tables compared whole (offsets, keys, values, timestamps, headers).
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

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.consumed import python_consume
from fanout_sink.kafka.native_consume import native_module
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


READER_CONF: dict[str, str] = {}
"""``--conf`` properties, for the sink's reader and the native one alike (a ``kafka:`` section)."""


def reader_conf(bootstrap: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, **READER_CONF}


def make_reader(bootstrap: str, group: str, native: bool) -> RangeReader:
    """A ``RangeReader`` on the native consume, or on confluent-kafka's (``native=False``)."""
    reader = RangeReader(KafkaClientFactory(reader_conf(bootstrap)), group)
    if not native:
        reader._consume = python_consume(reader._consumer)
    return reader


def range_reader(bootstrap: str, ends: dict[int, int], records: int) -> int:
    reader = make_reader(bootstrap, "readers-bench", native=False)
    rows = sum(
        chunk.num_rows for p, end in ends.items() for chunk in reader.read_chunks(TOPIC, p, 0, end, 50_000)
    )
    reader.close()
    return rows


def native_reader(bootstrap: str, ends: dict[int, int], records: int) -> int:
    reader = make_reader(bootstrap, "readers-native", native=True)
    rows = sum(
        chunk.num_rows for p, end in ends.items() for chunk in reader.read_chunks(TOPIC, p, 0, end, 50_000)
    )
    reader.close()
    return rows


def same_records(bootstrap: str, ends: dict[int, int]) -> bool:
    """Whether the native reader gives exactly RangeReader's tables: each partition's whole range and
    an inner one (starting and ending inside), chunks of 50,000 concatenated, compared whole."""
    python = make_reader(bootstrap, "readers-check", native=False)
    native = make_reader(bootstrap, "readers-check", native=True)
    same = True
    for p, end in ends.items():
        for start, stop in ((0, end), (1_234, max(1_234, end - 7_777))):
            want = pa.concat_tables(python.read_chunks(TOPIC, p, start, stop, 50_000))
            got = pa.concat_tables(native.read_chunks(TOPIC, p, start, stop, 50_000))
            offsets = want.column("offset").to_pylist() == got.column("offset").to_pylist()
            whole = want.equals(got)
            same = same and offsets and whole
            rows = f"RangeReader {want.num_rows:,} rows, native {got.num_rows:,}"
            verdict = f"offsets identical {offsets}, tables equal {whole}"
            print(f"  partition {p} [{start}, {stop}): {rows}; {verdict}", flush=True)
    python.close()
    native.close()
    return same


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
    """Wall, process CPU and, of it, the calling thread's (the rest: librdkafka's own threads)."""
    for run in (1, 2):
        cpu, mine, wall = time.process_time(), time.thread_time(), time.monotonic()
        rows = read()
        cpu, mine, wall = time.process_time() - cpu, time.thread_time() - mine, time.monotonic() - wall
        rate, per_record, own = rows / wall, 1e6 * cpu / rows, 1e6 * mine / rows
        print(f"{name} (run {run}): {rows:,} rows, {wall:.2f} s wall, {cpu:.2f} s CPU, "
              f"{rate:,.0f} records/s, {per_record:.2f} CPU us per record "
              f"({own:.2f} in the reading thread)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a librdkafka property for RangeReader and the native reader (e.g. fetch.queue.backoff.ms=10)",
    )
    args = parser.parse_args()
    READER_CONF.update(item.split("=", 1) for item in args.conf)
    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="readers-")))
    broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        ends = produce(bootstrap, args.records)
        print(f"{args.records:,} records over {PARTITIONS} partitions, ends {ends}", flush=True)
        if READER_CONF:
            print(f"readers' extra properties: {READER_CONF}", flush=True)
        measure("RangeReader, python consume", lambda: range_reader(bootstrap, ends, args.records))
        print(native_module()[1], flush=True)
        measure("RangeReader, native consume", lambda: native_reader(bootstrap, ends, args.records))
        print(f"native reader = RangeReader, exactly: {same_records(bootstrap, ends)}", flush=True)
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
