"""Every example in routing/ loads and routes, filters, projects and auto-creates as its comments say."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from support.raw_slices import from_messages, make_raw_slice
from support.registry import Registry, compile_protos, message_class

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.devtools.topics import read_to_end
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor

EXAMPLES = Path(__file__).resolve().parents[2] / "routing"
SOURCES = EXAMPLES.parent / "schemas" / "sources"


def _load(name: str, catalog_settings: CatalogSettings) -> SinkConfig:
    config = load_config(EXAMPLES / name)
    return config.model_copy(update={"catalog": catalog_settings})


def _values(*records: Any) -> list[bytes | None]:
    return [None if r is None else r if isinstance(r, bytes) else json.dumps(r).encode() for r in records]


def test_every_example_is_tested() -> None:
    tested = {"static-multi-table.yaml", "filter-projection.yaml", "dynamic.yaml", "dead-letter.yaml"}
    tested |= {"protobuf.yaml", "json-schema.yaml"}
    tested.add("cdc.yaml")
    tested.add("shop-demo.yaml")  # run end to end by tests/e2e/test_demo.py
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == tested


def test_static_multi_table(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _load("static-multi-table.yaml", catalog_settings)
    assert config.kafka["bootstrap.servers"] == "127.0.0.1:9092"  # ${KAFKA_BOOTSTRAP:-...} default
    orders, payments = (
        config.maintenance_for("analytics.orders"),
        config.maintenance_for("analytics.payments"),
    )
    assert (orders.sort_order, orders.min_input_files, payments.sort_order) == ("ts, id", 5, None)
    process = build_processor(config, catalog)
    out = process(
        make_raw_slice(
            _values(
                {
                    "type": "order",
                    "id": 1,
                    "customer": "c1",
                    "amount": 1500.005,
                    "ts": "2024-05-01T10:00:00Z",
                },
                {"type": "order", "id": 2, "customer": "c2", "amount": 20, "ts": 1714557600000},
                {"type": "payment", "id": 3, "method": "card", "amount": 20.5},
                {"type": "click"},
            ),
            topic="shop-events",
        )
    )
    assert out.filtered == 1 and out.dead_letters == []
    orders = out.tables["analytics.orders"].rows.to_pylist()
    assert [o["id"] for o in orders] == [1, 2]
    assert str(orders[0]["total"]) == "1500.01"  # half-up to the declared scale
    assert out.tables["analytics.payments"].rows.to_pylist()[0]["method"] == "card"
    assert out.tables["analytics.big_spenders"].rows.to_pylist() == [
        {"id": 1, "customer": None, "amount": 1500.005}  # customer.id of a string customer is null
    ]
    assert [str(f.transform) for f in out.tables["analytics.orders"].table.spec().fields] == [
        "day",
        "bucket[8]",
    ]
    assert process.last_stats.reconciles()


def test_filter_projection(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _load("filter-projection.yaml", catalog_settings)
    process = build_processor(config, catalog)
    order = {
        "type": "order",
        "id": 7,
        "customer": {"id": "c7", "name": "Ada"},
        "shipping": {"country": "FR"},
        "sku": "ABC-1",
        "amount": 9.5,
        "ts": "2024-05-01T10:00:00+02:00",
    }
    signup = {
        "type": "signup",
        "user": {"userId": 1, "EMAIL": "a@b", "tags": ["vip-1", "x"], "referrer": "r"},
    }
    out = process(
        make_raw_slice(
            _values(order, {**order, "shipping": {"country": "US"}}, {**order, "sku": "x"}, signup, None),
            topic="shop-events",
        )
    )
    eu = out.tables["analytics.eu_orders"].rows.to_pylist()
    assert len(eu) == 1
    assert eu[0]["order_id"] == 7 and eu[0]["customer_id"] == "c7" and eu[0]["country"] == "FR"
    assert eu[0]["source_topic"] == "shop-events"
    assert eu[0]["ts"].hour == 8  # converted to UTC
    customers = out.tables["analytics.customers"].rows.to_pylist()
    assert customers == [{"id": 1, "email": "a@b", "tags": ["vip-1"], "referred": True, "referrer": "r"}]
    assert out.filtered == 3  # two orders outside the filter, one skipped tombstone
    assert process.last_stats.reconciles()


def test_dynamic(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _load("dynamic.yaml", catalog_settings)
    process = build_processor(config, catalog)
    row = {"id": 1, "ts": "2024-05-01T10:00:00Z"}
    out = process(make_raw_slice(_values(row, {**row, "id": 2}), topic="Shop-Orders"))
    assert set(out.tables) == {"raw.shop_orders"}
    table = out.tables["raw.shop_orders"].table
    assert [str(f.transform) for f in table.spec().fields] == ["day"]
    assert catalog.load_table("raw.shop_orders").schema().find_field("ts")
    # A topic outside the allow pattern is dead-lettered and no table is created.
    out = process(make_raw_slice(_values(row), topic="shop..orders"))
    assert out.tables == {}
    assert deadletter.header(out.dead_letters[0], deadletter.STAGE) == "route"
    assert "empty part" in (deadletter.header(out.dead_letters[0], deadletter.REASON) or "")
    assert [t for t in catalog.list_tables("raw")] == [("raw", "shop_orders")]
    # A new field evolves the auto-created table.
    out = process(make_raw_slice(_values({**row, "extra": True}), topic="Shop-Orders"))
    assert out.tables["raw.shop_orders"].rows.column("extra").to_pylist() == [True]


def test_cdc(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _load("cdc.yaml", catalog_settings)
    process = build_processor(config, catalog)

    def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
        return {"op": op, "before": before, "after": after, "source": {"table": "customers"}, "ts_ms": 1}

    ann, bob = {"id": 1, "name": "ann"}, {"id": 2, "name": "bob"}
    out = process(
        make_raw_slice(
            _values(
                event("r", None, ann),
                event("c", None, bob),
                event("u", ann, {**ann, "name": "anne"}),
                event("d", bob, None),
                None,  # the tombstone after the delete
                event("t", None, None),  # a truncate: not applied, dead-lettered
            ),
            topic="dbserver1.crm.customers",
        )
    )
    customers = out.tables["crm.customers"]
    assert customers.rows.to_pylist() == [{"id": 1, "name": "anne"}]
    assert customers.deleted_keys is not None and customers.deleted_keys.to_pylist() == [{"id": 2}]
    assert customers.table.schema().identifier_field_names() == {"id"}
    assert [str(f.transform) for f in customers.table.spec().fields] == ["bucket[16]"]
    assert deadletter.header(out.dead_letters[0], deadletter.STAGE) == "truncate"
    assert process.last_stats.filtered == 1 and process.last_stats.reconciles()
    account = {"kind": "account", "owner": "o", "balance": 5, "status": "open"}
    out = process(
        make_raw_slice(
            _values({**account, "id": 7}, {**account, "id": 8}, {**account, "id": 8, "status": "closed"}),
            topic="crm-accounts",
        )
    )
    accounts = out.tables["crm.accounts"]
    assert accounts.rows.to_pylist() == [{"id": 7, "owner": "o", "balance": 5, "status": "open"}]
    assert accounts.deleted_keys is not None and accounts.deleted_keys.to_pylist() == [{"id": 8}]


def test_dead_letter(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _load("dead-letter.yaml", catalog_settings)
    process = build_processor(config, catalog)
    good = {"type": "order", "id": 1, "customer": {"id": "c"}, "amount": 1, "ts": "2024-05-01T10:00:00Z"}
    out = process(
        make_raw_slice(
            _values(
                good,
                b"{broken",
                {"type": "click"},
                {**good, "id": "one"},
                {**good, "ts": None},
                None,
            ),
            topic="shop-events",
            start_offset=100,
            keys=[b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"],
            headers=[[("trace", b"t0")], [("trace", b"t1")], [], [], [], []],
        )
    )
    assert out.tables["analytics.orders"].rows.column("id").to_pylist() == [1]
    letters = {deadletter.header(d, deadletter.SOURCE_OFFSET): d for d in out.dead_letters}
    assert sorted(letters) == ["101", "102", "103", "104", "105"]
    broken = letters["101"]
    assert broken.key == b"k1" and broken.value == b"{broken"
    assert ("trace", b"t1") in broken.headers
    assert deadletter.header(broken, deadletter.STAGE) == "decode"
    assert deadletter.header(broken, deadletter.SINK) == "shop-dlq"
    assert deadletter.header(broken, deadletter.SOURCE_TOPIC) == "shop-events"
    assert deadletter.header(broken, deadletter.SOURCE_PARTITION) == "0"
    assert deadletter.header(letters["102"], deadletter.STAGE) == "route"
    assert deadletter.header(letters["103"], deadletter.COLUMN) == "id"
    assert deadletter.header(letters["103"], deadletter.TABLE) == "analytics.orders"
    assert "cannot convert 'one'" in (deadletter.header(letters["103"], deadletter.REASON) or "")
    assert deadletter.header(letters["104"], deadletter.COLUMN) == "ts"
    assert "required column 'ts'" in (deadletter.header(letters["104"], deadletter.REASON) or "")
    assert deadletter.header(letters["105"], deadletter.STAGE) == "tombstone"
    assert process.last_stats.reconciles()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The Schema Registry stand-in, named by the examples' ``${SCHEMA_REGISTRY_URL}``."""
    served = Registry()
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", served.url)
    yield served
    served.close()


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[Any]:
    """``values`` through the real broker: the messages a consumer of ``topic`` reads."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    return from_messages(read_to_end(bootstrap, [topic]))


def test_protobuf(
    catalog_settings: CatalogSettings,
    catalog: Any,
    registry: Registry,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
) -> None:
    """Values written by confluent-kafka's ProtobufSerializer with classes protoc made from
    schemas/sources: the sink reads them with the registered schema and its reference."""
    pool = compile_protos(SOURCES, "shop/order.proto")
    order_class, refund_class = message_class(pool, "shop.Order"), message_class(pool, "shop.Refund")
    client = SchemaRegistryClient({"url": registry.url})
    topic = make_topic("shop-orders-pb")
    context = SerializationContext(topic, MessageField.VALUE)
    orders = ProtobufSerializer(order_class, client, {"use.deprecated.format": False})
    refunds = ProtobufSerializer(refund_class, client, {"use.deprecated.format": False})

    order: Any = order_class(id=1, status=order_class.SHIPPED, signature=b"\x00\xff")
    order.customer.id, order.customer.tier = "c1", "gold"
    order.lines.add(sku="A-1", quantity=2)
    order.total.currency, order.total.units = "EUR", 12
    order.ts.FromMilliseconds(1714557600123)
    order.coupon.value = "SPRING"
    order.labels["channel"] = "web"
    plain: Any = order_class(id=2)  # every field left at its default
    plain.ts.FromMilliseconds(1714557600000)
    refund: Any = refund_class(order_id=1, reason="late")
    refund.amount.currency, refund.amount.units = "EUR", 5
    values = [orders(order, context), refunds(refund, context), orders(plain, context), b"\x00not protobuf"]
    raw = _produce(bootstrap_servers, topic, values)

    process = build_processor(_load("protobuf.yaml", catalog_settings), catalog)
    out = process(raw)
    rows = out.tables["analytics.pb_orders"].rows.to_pylist()
    assert rows[0] == {
        "id": 1,
        "customer": "c1",
        "tier": "gold",
        "status": "SHIPPED",
        "currency": "EUR",
        "units": 12,
        "lines": [{"sku": "A-1", "quantity": 2}],
        "coupon": "SPRING",
        "labels": [("channel", "web")],
        "signature": b"\x00\xff",
        "ts": datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC),
    }
    assert rows[1]["id"] == 2 and rows[1]["status"] == "STATUS_UNSPECIFIED"
    assert rows[1]["customer"] is None and rows[1]["coupon"] is None and rows[1]["lines"] == []
    assert out.tables["analytics.pb_refunds"].rows.to_pylist() == [
        {"order_id": 1, "currency": "EUR", "units": 5, "reason": "late", "ts": None}
    ]
    schema = catalog.load_table("analytics.pb_orders").schema()
    assert str(schema.find_field("ts").field_type) == "timestamptz"
    assert str(schema.find_field("signature").field_type) == "binary"
    # The reference was fetched from the registry: the sink has only the writer schema's id.
    assert any(r.startswith("/subjects/shop%2Fcommon.proto/versions/1") for r in registry.requests)
    [letter] = out.dead_letters
    assert deadletter.header(letter, deadletter.STAGE) == "decode"
    assert deadletter.header(letter, deadletter.SOURCE_OFFSET) == "3"
    assert "not Confluent wire format" in (deadletter.header(letter, deadletter.REASON) or "")
    assert process.last_stats.reconciles()


def test_json_schema(
    catalog_settings: CatalogSettings,
    catalog: Any,
    registry: Registry,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
) -> None:
    """Values written by confluent-kafka's JSONSerializer with a schema that references another
    subject; a value that fails validation against its writer schema is dead-lettered."""
    client = SchemaRegistryClient({"url": registry.url})
    client.register_schema("shop.Money", Schema((SOURCES / "shop/money.schema.json").read_text(), "JSON"))
    reference = SchemaReference("money.schema.json", "shop.Money", 1)
    payment = Schema((SOURCES / "shop/payment.schema.json").read_text(), "JSON", [reference])
    topic = make_topic("shop-payments")
    context = SerializationContext(topic, MessageField.VALUE)
    serialize = JSONSerializer(payment, client)
    first = {
        "id": 1,
        "order_id": 7,
        "method": "card",
        "amount": {"currency": "EUR", "value": 12.5},
        "ts": "2024-05-01T10:00:00+02:00",
    }
    second = {
        **first,
        "id": 2,
        "method": "voucher",
        "amount": {"currency": "EUR", "value": 3},
        "note": "gift",
    }
    invalid = serialize(first, context).replace(b'"card"', b'"cash"')  # not in the schema's enum
    raw = _produce(bootstrap_servers, topic, [serialize(first, context), invalid, serialize(second, context)])

    process = build_processor(_load("json-schema.yaml", catalog_settings), catalog)
    out = process(raw)
    rows = out.tables["analytics.payments"].rows.to_pylist()
    assert [(r["id"], r["method"], str(r["amount"]), r["note"]) for r in rows] == [
        (1, "card", "12.50", None),
        (2, "voucher", "3.00", "gift"),
    ]
    assert rows[0]["ts"] == datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
    [letter] = out.dead_letters
    assert deadletter.header(letter, deadletter.SOURCE_OFFSET) == "1"
    assert deadletter.header(letter, deadletter.STAGE) == "decode"
    assert "'cash' is not one of" in (deadletter.header(letter, deadletter.REASON) or "")
    assert process.last_stats.reconciles()


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_redact_cleanly(name: str) -> None:
    config = load_config(EXAMPLES / name)
    assert config.redacted()["name"] == config.name
