"""The Spark app on a Debezium change stream: PyIceberg and Spark SQL show each key's last state.

Two Debezium topics, one per source table as Debezium writes them: ``customers`` in Kafka Connect's
``{"schema", "payload"}`` JSON (logical types: a date, a decimal), ``accounts`` as plain JSON
(``schemas.enable=false``), partitioned by a column that changes (a row moves partition). Deletes
are followed by tombstones, as Debezium sends them. One app run of several micro-batches and
commit rounds; the model replays the same events in offset order.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
import re
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Producer
from support.common import register_spark_catalog
from support.sink_factory import SinkFactory, SinkUnderTest

pytestmark = pytest.mark.usefixtures("own_spark")

EPOCH = dt.date(1970, 1, 1)
CUSTOMER_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "birth", "type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1},
    {
        "field": "balance",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "12"},
    },
]
CUSTOMER_SCHEMA = {
    "type": "struct",
    "name": "dbserver1.crm.Envelope",
    "optional": False,
    "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": CUSTOMER_FIELDS},
        {"field": "after", "type": "struct", "optional": True, "fields": CUSTOMER_FIELDS},
        {
            "field": "source",
            "type": "struct",
            "optional": False,
            "fields": [{"field": "table", "type": "string", "optional": False}],
        },
        {"field": "op", "type": "string", "optional": False},
        {"field": "ts_ms", "type": "int64", "optional": True},
    ],
}
Model = dict[str, dict[int, tuple[Any, ...]]]


def _customer(key: int, rng: random.Random) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A customer row as Debezium sends it, and as the table must show it."""
    birth = EPOCH + dt.timedelta(days=rng.randrange(20_000))
    cents = rng.randrange(-(10**7), 10**7)
    wire = cents.to_bytes((cents.bit_length() + 8) // 8, "big", signed=True)  # Connect's Decimal bytes
    name = f"c{key}-{rng.randrange(1000)}"
    row = {"id": key, "name": name, "birth": (birth - EPOCH).days, "balance": base64.b64encode(wire).decode()}
    return row, (name, birth, Decimal(cents).scaleb(-2))


def _account(key: int, rng: random.Random) -> tuple[dict[str, Any], tuple[Any, ...]]:
    status = rng.choice(["open", "frozen", "vip"])
    owner = f"o{rng.randrange(100)}"
    return {"id": key, "owner": owner, "status": status}, (owner, status)


class ChangeStream:
    """Debezium events for ``customers`` (wrapped) and ``accounts`` (plain), keyed by id, and the model."""

    def __init__(self, sink: SinkUnderTest, seed: int) -> None:
        self.sink = sink
        self.rng = random.Random(seed)
        self.model: Model = {"crm.customers": {}, "crm.accounts": {}}
        self.rows: dict[str, dict[int, dict[str, Any]]] = {"customers": {}, "accounts": {}}
        self.producer = Producer({"bootstrap.servers": sink.bootstrap, "linger.ms": 5})

    def _send(self, table: str, key: int, op: str, before: Any, after: Any) -> None:
        payload = {"before": before, "after": after, "source": {"table": table}, "op": op, "ts_ms": 1}
        value = {"schema": CUSTOMER_SCHEMA, "payload": payload} if table == "customers" else payload
        message_key = json.dumps({"id": key}).encode()
        topic = self.sink.topics[table]
        self.producer.produce(topic, key=message_key, value=json.dumps(value).encode())
        if op == "d":
            self.producer.produce(topic, key=message_key, value=None)  # Debezium's tombstone

    def changes(self, count: int, keys: int) -> None:
        for _ in range(count):
            table = self.rng.choice(["customers", "accounts"])
            key = self.rng.randrange(keys)
            live = self.rows[table]
            make = _customer if table == "customers" else _account
            if key in live and self.rng.random() < 0.3:
                self._send(table, key, "d", live.pop(key), None)
                del self.model[f"crm.{table}"][key]
                continue
            row, shown = make(key, self.rng)
            self._send(table, key, "u" if key in live else "c", live.get(key), row)
            live[key] = row
            self.model[f"crm.{table}"][key] = shown
        assert self.producer.flush(60) == 0


def _tables(sink: SinkUnderTest) -> dict[str, dict[int, tuple[Any, ...]]]:
    """Each table through PyIceberg as key -> the other columns; a key twice fails."""
    found = {}
    for table, columns in (
        ("crm.customers", ("name", "birth", "balance")),
        ("crm.accounts", ("owner", "status")),
    ):
        rows = sink.catalog.load_table(table).scan().to_arrow().to_pylist()
        keys = [r["id"] for r in rows]
        assert len(keys) == len(set(keys)), f"{table}: a key holds two rows"
        found[table] = {r["id"]: tuple(r[c] for c in columns) for r in rows}
    return found


def test_a_debezium_stream_leaves_each_key_in_its_last_state_for_pyiceberg_and_spark_sql(
    sink_factory: SinkFactory, spark: Any
) -> None:
    sink = sink_factory(
        partitions={"customers": 2, "accounts": 2},
        prefix="cdc",
        overrides={
            "tables": {
                "crm.customers": {
                    "when": "source.table == 'customers'",
                    "changes": {"format": "debezium", "key": ["id"]},
                    "partition-by": ["bucket[4](id)"],
                },
                "crm.accounts": {
                    "when": "source.table == 'accounts'",
                    "changes": {"format": "debezium", "key": ["id"]},
                    "partition-by": ["status"],
                },
            }
        },
    )
    stream = ChangeStream(sink, seed=23)
    stream.changes(350, keys=40)
    # Several micro-batches and commit rounds: later changes hit rows committed rounds before.
    log = sink.run("--available-now", "--max-offsets-per-trigger", "100")
    assert log.count(" committed (") >= 4, log[-3000:]
    deleting = r"crm\.\w+: \d+ rows, \d+ files, \d+ keys deleted"
    assert re.search(deleting, log), "the batch line counts the keys each batch deletes"
    assert _tables(sink) == stream.model

    catalog = register_spark_catalog(spark, sink.settings)
    customers = {
        r.id: (r.name, r.birth, r.balance)
        for r in spark.sql(f"SELECT id, name, birth, balance FROM {catalog}.crm.customers").collect()
    }
    accounts = {
        r.id: (r.owner, r.status)
        for r in spark.sql(f"SELECT id, owner, status FROM {catalog}.crm.accounts").collect()
    }
    assert customers == stream.model["crm.customers"]
    assert accounts == stream.model["crm.accounts"]
    counted = spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT id) AS k FROM {catalog}.crm.accounts"
    ).collect()[0]
    assert counted.n == counted.k == len(stream.model["crm.accounts"])
    summary = sink.catalog.load_table("crm.accounts").current_snapshot().summary
    assert summary.operation.value in {"append", "overwrite"}
