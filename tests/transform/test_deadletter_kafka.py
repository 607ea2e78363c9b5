"""Dead letters through a real broker: consumed records in, transactional dead letters out."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from support.raw_slices import from_messages
from support.sink_factory import SinkFactory

from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor


def test_dead_letters_round_trip_in_a_transaction(
    make_topic: Callable[..., str], sink_factory: SinkFactory, read_topic: Callable[..., list[Any]]
) -> None:
    dlq = make_topic("dlq")
    sink = sink_factory(
        partitions={"orders": 1},
        name="shop",
        source={"tombstones": "dead-letter"},
        overrides={
            "tables": {"analytics.orders": {"when": "type == 'order'"}},
            "dynamic": None,
            "dead-letter": {"topic": dlq},
        },
    )
    source = sink.topic
    producer = Producer({"bootstrap.servers": sink.bootstrap})
    good = {"type": "order", "id": 1}
    producer.produce(source, key=b"k0", value=json.dumps(good).encode(), headers=[("trace", b"t0")])
    producer.produce(source, key=b"k1", value=b"{not json", headers=[("trace", b"t1")])
    producer.produce(source, key=b"k2", value=None)
    producer.flush(30)
    raw = from_messages(read_topic(source))
    assert raw.num_rows == 3

    out = build_processor(sink.config, sink.catalog)(raw)
    assert out.tables["analytics.orders"].rows.to_pylist() == [{"type": "order", "id": 1}]
    assert len(out.dead_letters) == 2

    # What the worker does: dead letters inside its transaction; an aborted attempt leaves nothing.
    txn = Producer({"bootstrap.servers": sink.bootstrap, "transactional.id": f"{dlq}-worker"})
    txn.init_transactions(30)
    txn.begin_transaction()
    deadletter.publish(txn, dlq, out.dead_letters, 1_000_000)
    txn.abort_transaction(30)
    txn.begin_transaction()
    deadletter.publish(txn, dlq, out.dead_letters, 1_000_000)
    txn.commit_transaction(30)

    published = read_topic(dlq)
    assert len(published) == 2  # the aborted copies are invisible to read_committed
    bad, tombstone = published
    assert (bad.key(), bad.value()) == (b"k1", b"{not json")
    headers = dict(bad.headers())
    assert headers["trace"] == b"t1"
    assert headers[deadletter.STAGE] == b"decode"
    assert headers[deadletter.SOURCE_TOPIC] == source.encode()
    assert headers[deadletter.SOURCE_OFFSET] == b"1"
    assert headers[deadletter.SINK] == b"shop"
    assert headers[deadletter.REASON].startswith(b"invalid JSON")
    assert (tombstone.key(), tombstone.value()) == (b"k2", None)
    assert dict(tombstone.headers())[deadletter.STAGE] == b"tombstone"
