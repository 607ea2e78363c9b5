"""What a worker pays per range to read a fan-out partition group: many small ranges, one assignment.

    PYTHONPATH=tests python -m bench.group_reads --partitions 2500 --records 30 --repeat 3 [--profile]
        [--compare OLD_RANGE_READER_PY]

A broker of its own (the stack's, in a temporary folder; or ``--bootstrap-servers``), one topic of
``--partitions`` partitions; every partition gets ``--records`` records in one transaction (so each
planned range ends in its commit marker), then as many again in a second one, past the planned ends,
as a live source has. A task of a fan-out batch is then read as ``spark/task.py`` reads it: one
:meth:`RangeReader.assigned` of every range, each range read in turn with ``read_chunks``, the
small ranges fetched ahead. One reader is kept across the repeats, as a Python worker keeps one.
``--compare`` names another ``range_reader.py`` (``git show main:fanout_sink/kafka/range_reader.py``):
its reader reads the same ranges, taking turns with this one, so that both share the machine alike.

Per range it reports the calling process's CPU (librdkafka's threads included) and the reading
thread's, the wall time (the machine may be shared: CPU is the steadier measure), and the consumer
calls that wait for librdkafka's threads (``pause``, ``resume``, ``seek``, ``assign``); with
``--profile``, cProfile's top entries of one read of the group. Every range's rows are counted.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.range_reader import RangeReader

TOPIC = "group-reads"
WAITING_CALLS = ("pause", "resume", "seek", "assign", "unassign", "position")


class _CountedCalls:
    """The reader's consumer, counting the calls that wait for librdkafka's threads."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        if name in WAITING_CALLS:
            self.calls[name] += 1
        return getattr(self._consumer, name)


def produce(bootstrap: str, partitions: int, records: int) -> int:
    """Two transactions of ``records`` per partition; the planned ranges' end (the first's marker + 1)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(120)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "group-reads", "linger.ms": 20})
    producer.init_transactions(60)
    for round_ in range(2):
        producer.begin_transaction()
        for n in range(records):
            for partition in range(partitions):
                value = b'{"table":"t%d","seq":%d,"round":%d,"note":"xxxxxxxxxxxxxxxx"}' % (
                    partition,
                    n,
                    round_,
                )
                producer.produce(TOPIC, value, partition=partition)
            producer.poll(0)
        producer.commit_transaction(120)
    return records + 1


def read_group(reader: RangeReader, partitions: int, end: int) -> int:
    """Every partition's ``[0, end)`` inside one assignment, as a task reads its partition group."""
    rows = 0
    with reader.assigned([(TOPIC, p, 0, end) for p in range(partitions)]):
        for partition in range(partitions):
            rows += sum(chunk.num_rows for chunk in reader.read_chunks(TOPIC, partition, 0, end, 50_000))
    return rows


def _reader_class(path: str | None) -> type[RangeReader]:
    """``RangeReader`` of another copy of ``range_reader.py``, or this one's."""
    if path is None:
        return RangeReader
    spec = importlib.util.spec_from_file_location("compared_range_reader", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.RangeReader  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2500)
    parser.add_argument("--records", type=int, default=30, help="records per partition and range")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap-servers", help="a broker to use instead of starting one")
    parser.add_argument("--profile", action="store_true", help="cProfile one more read of the group")
    parser.add_argument("--compare", metavar="RANGE_READER_PY", help="another range_reader.py, read in turns")
    args = parser.parse_args(argv)
    broker = None
    if args.bootstrap_servers is None:
        broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="group-reads-")))
        broker.start()
    bootstrap = args.bootstrap_servers or broker.bootstrap_servers  # type: ignore[union-attr]
    try:
        end = produce(bootstrap, args.partitions, args.records)
        readers = {}
        for name, path in (("this", None), ("compared", args.compare)):
            if name == "this" or path is not None:
                reader = _reader_class(path)(
                    KafkaClientFactory({"bootstrap.servers": bootstrap}), f"gr-{name}"
                )
                reader._consumer = _CountedCalls(reader._consumer)  # type: ignore[assignment]
                readers[name] = reader
        want = args.partitions * args.records
        print(
            f"{args.partitions:,} ranges of {args.records} records (+ a marker), one assignment", flush=True
        )
        for run in range(1, args.repeat + 1):
            for name, reader in readers.items():
                counted: _CountedCalls = reader._consumer  # type: ignore[assignment]
                counted.calls.clear()
                cpu, mine, wall = time.process_time(), time.thread_time(), time.monotonic()
                rows = read_group(reader, args.partitions, end)
                cpu, mine, wall = (
                    time.process_time() - cpu,
                    time.thread_time() - mine,
                    time.monotonic() - wall,
                )
                per = 1000 / args.partitions
                calls = ", ".join(f"{c} {counted.calls[c]}" for c in WAITING_CALLS if counted.calls[c])
                wrong = "" if rows == want else f" (WRONG: {want:,} expected)"
                print(
                    f"run {run} {name}: {rows:,} rows{wrong}; "
                    f"per range {cpu * per:.3f} ms CPU ({mine * per:.3f} in the reading thread), "
                    f"{wall * per:.3f} ms wall; calls: {calls}",
                    flush=True,
                )
                if rows != want:
                    return 1
        if args.profile:
            for name, reader in readers.items():
                print(f"profile, {name}:", flush=True)
                profiler = cProfile.Profile()
                profiler.runcall(read_group, reader, args.partitions, end)
                pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(12)
        for reader in readers.values():
            reader.close()
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
