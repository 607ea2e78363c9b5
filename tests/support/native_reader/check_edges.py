"""Edge cases of the native reader against ``RangeReader``, on a broker of its own (a few seconds).

    PYTHONPATH=. .venv/bin/python tests/support/native_reader/check_edges.py

One partition holds: records with headers (one header value null), tombstones (null values), null
keys, empty values and keys, a committed transaction, an aborted one, another committed one (so
markers and aborted records fall inside and at the end of ranges), then plain records. Every range
below is read by both readers, in chunks of 7 and all at once, and the tables compared whole. Then a
start past the partition's end must fail (``auto.offset.reset: error``) in both.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.range_reader import RangeReader
from tests.support.native_reader import NativeRangeReader

TOPIC = "edges"


def produce(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "edges", "linger.ms": 5})
    producer.init_transactions(60)

    def batch(first: int, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(first, first + 20):
            headers = [("h", b"v%d" % i), ("n", None), ("ü", b"")] if i % 3 == 0 else None
            key = None if i % 5 == 0 else (b"" if i % 7 == 0 else b"k%d" % i)
            value = None if i % 4 == 0 else (b"" if i % 6 == 0 else b"value %d" % i)
            producer.produce(TOPIC, value, key=key, headers=headers, partition=0)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)

    batch(0, True)
    batch(100, False)
    batch(200, True)
    batch(300, True)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "edges-ends"})
    end = int(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)[1])
    consumer.close()
    return end


def main() -> None:
    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="edges-")))
    broker.start()
    ok = True
    try:
        bootstrap = broker.bootstrap_servers
        end = produce(bootstrap)
        python = RangeReader(KafkaClientFactory({"bootstrap.servers": bootstrap}), "edges", 10)
        native = NativeRangeReader({"bootstrap.servers": bootstrap}, "edges", 10)
        offsets = python.read(TOPIC, 0, 0, end).column("offset").to_pylist()
        print(f"end offset {end}; the visible offsets: {offsets}")
        # Starts and ends all over the partition (on markers and aborted records too), and the last.
        ranges = [(a, b) for a in range(0, end, 5) for b in range(a + 1, end + 1, 11)] + [(end - 1, end)]
        for start, stop in ranges:
            for chunk in (7, None):
                want = list(python.read_chunks(TOPIC, 0, start, stop, chunk))
                got = list(native.read_chunks(TOPIC, 0, start, stop, chunk))
                sizes = [t.num_rows for t in want] == [t.num_rows for t in got]
                same = sizes and (not want or pa.concat_tables(want).equals(pa.concat_tables(got)))
                rows = sum(t.num_rows for t in got)
                if not same:
                    print(f"[{start}, {stop}) chunks of {chunk}: {rows} rows, NOT the same")
                ok = ok and same
        print(f"{len(ranges)} ranges, each in chunks of 7 and whole, compared; all same: {ok}")
        whole = pa.concat_tables(native.read_chunks(TOPIC, 0, 0, end))
        print(whole.slice(0, 4).to_pylist())
        for name, reader in (("RangeReader", python), ("native", native)):
            try:
                list(reader.read_chunks(TOPIC, 0, end + 100, end + 200))
            except Exception as error:
                print(f"{name}, start past the end: {type(error).__name__}: {str(error).splitlines()[0]}")
            else:
                print(f"{name}, start past the end: no error")
                ok = False
        python.close()
        native.close()
    finally:
        broker.stop()
    print("all same:", ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
