"""Dead letters through a real broker: consumed records in, transactional dead letters out."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.devtools.raw_slices import from_messages
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor


def test_dead_letters_round_trip_in_a_transaction(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog_settings: CatalogSettings,
    catalog: Any,
    read_topic: Callable[..., list[Any]],
) -> None:
    source, dlq = make_topic("orders"), make_topic("dlq")
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    good = {"type": "order", "id": 1}
    producer.produce(source, key=b"k0", value=json.dumps(good).encode(), headers=[("trace", b"t0")])
    producer.produce(source, key=b"k1", value=b"{not json", headers=[("trace", b"t1")])
    producer.produce(source, key=b"k2", value=None)
    producer.flush(30)
    raw = from_messages(read_topic(source))
    assert raw.num_rows == 3

    config = parse_config(
        {
            "name": "shop",
            "kafka": {"bootstrap.servers": bootstrap_servers},
            "source": {"topics": [source], "tombstones": "dead-letter"},
            "catalog": catalog_settings.model_dump(),
            "tables": {"analytics.orders": {"when": "type == 'order'"}},
            "dead-letter": {"topic": dlq},
        },
        "test",
    )
    out = build_processor(config, catalog)(raw)
    assert out.tables["analytics.orders"].rows.to_pylist() == [{"type": "order", "id": 1}]
    assert len(out.dead_letters) == 2

    # What the worker does: dead letters inside its transaction; an aborted attempt leaves nothing.
    txn = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"{dlq}-worker"})
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
