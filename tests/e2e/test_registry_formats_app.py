"""confluent-protobuf through the real app (broker, Spark, catalog): Spark's Python workers read
the values with the writer schema and its reference from the registry stand-in, which learns the
writer schema only after the first attempt looked for it (a lagging follower, a restore): the batch
is retried until it does, and no record is dead-lettered (issue 33 item 5)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from support.registry import Registry, compile_protos, message_class
from support.sink_factory import SinkFactory

from fanout_sink.catalog import CatalogSettings, load_catalog

pytestmark = pytest.mark.usefixtures("own_spark")

SOURCES = Path(__file__).resolve().parents[2] / "schemas" / "sources"


def test_protobuf_orders_land_through_the_app(
    bootstrap_servers: str,
    catalog_settings: CatalogSettings,
    make_topic: Callable[..., str],
    sink_factory: SinkFactory,
) -> None:
    registry = Registry()
    try:
        topic = make_topic("orders-pb", partitions=2)
        order_class = message_class(compile_protos(SOURCES, "shop/order.proto"), "shop.Order")
        serialize = ProtobufSerializer(
            order_class, SchemaRegistryClient({"url": registry.url}), {"use.deprecated.format": False}
        )
        context = SerializationContext(topic, MessageField.VALUE)
        producer = Producer({"bootstrap.servers": bootstrap_servers})
        for i in range(200):
            order: Any = order_class(id=i, status=order_class.PLACED)
            order.customer.id = f"c{i}"
            order.ts.FromMilliseconds(1714557600000 + i)
            value = serialize(order, context)
            producer.produce(topic, key=str(i).encode(), value=value)
        assert producer.flush(30) == 0
        # More misses than one attempt's look-ups (one wait budget per slice, 2 slices): the first
        # attempt fails, a later one reads the schema. No dead-letter topic: a dead letter fails.
        registry.lag(struct.unpack(">I", value[1:5])[0], misses=24)
        source = {"topics": [topic], "format": "confluent-protobuf", "schema-registry": {"url": registry.url}}
        tables = {"shop.pb_orders": {"select": "{id: id, customer: customer.id, status: status, ts: ts}"}}
        sink = sink_factory(
            topics={"orders": topic},
            overrides={"source": source, "tables": tables, "dynamic": None},
        )
        log = sink.run("--available-now")
    finally:
        registry.close()
    rows = (
        load_catalog(catalog_settings)
        .load_table("shop.pb_orders")
        .scan()
        .to_arrow()
        .sort_by("id")
        .to_pylist()
    )
    assert [r["id"] for r in rows] == list(range(200))
    assert "unknown to the Schema Registry" in log
    assert rows[7] == {
        "id": 7,
        "customer": "c7",
        "status": "PLACED",
        "ts": datetime(2024, 5, 1, 10, 0, 0, 7000, tzinfo=UTC),
    }
