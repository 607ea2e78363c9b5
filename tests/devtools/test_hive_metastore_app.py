"""The app end to end on a Hive Metastore (``catalog: {type: hive, uri: thrift://...}``): the stack's
metastore (Hive 3.1.3, embedded Derby, tables in a local folder), one ``run --available-now`` that
auto-creates a table and evolves it (a later record brings a column) and applies a Debezium stream to
a change table, then ``fanout-sink maintain`` once, then PyIceberg and Spark SQL (``fanout-sink sql``)
read the same rows. Lean on purpose: hundreds of records, three JVM starts (run, maintain, sql)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chaos.app_process import child_env
from confluent_kafka import Producer
from support.sink_factory import new_sink
from support.sql_cli import run_sql_cli

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.hive_metastore import HiveMetastore

ORDERS, ACCOUNTS = "shop.orders", "crm.accounts"
ORDERS_BEFORE_COUPON, ORDERS_WITH_COUPON = 120, 80
CHANGES, KEYS = 300, 40


def _orders(producer: Producer, topic: str) -> list[tuple[int, int, str | None]]:
    """Orders, the later ones with a ``coupon`` the table does not have yet; the rows they make."""
    rows = []
    for i in range(ORDERS_BEFORE_COUPON + ORDERS_WITH_COUPON):
        order: dict[str, Any] = {"kind": "order", "id": i, "cents": 100 + i}
        if i >= ORDERS_BEFORE_COUPON:
            order["coupon"] = f"c{i % 7}"
        producer.produce(topic, value=json.dumps(order).encode())
        rows.append((i, 100 + i, order.get("coupon")))
    return rows


def _changes(producer: Producer, topic: str) -> dict[int, tuple[str, str]]:
    """Debezium events (plain JSON, tombstones after deletes) for ``accounts``; each key's last state."""
    rng = random.Random(11)
    live: dict[int, dict[str, Any]] = {}
    for _ in range(CHANGES):
        key = rng.randrange(KEYS)
        message_key = json.dumps({"id": key}).encode()
        if key in live and rng.random() < 0.3:
            payload = {"before": live.pop(key), "after": None, "source": {"table": "accounts"}, "op": "d"}
            producer.produce(topic, key=message_key, value=json.dumps(payload).encode())
            producer.produce(topic, key=message_key, value=None)
            continue
        row = {"id": key, "owner": f"o{rng.randrange(100)}", "status": rng.choice(["open", "frozen", "vip"])}
        op = "u" if key in live else "c"
        payload = {"before": live.get(key), "after": row, "source": {"table": "accounts"}, "op": op}
        producer.produce(topic, key=message_key, value=json.dumps(payload).encode())
        live[key] = row
    return {key: (row["owner"], row["status"]) for key, row in live.items()}


def _pyiceberg(settings: CatalogSettings) -> tuple[list[tuple[Any, ...]], dict[int, tuple[str, str]]]:
    catalog = load_catalog(settings)
    orders = catalog.load_table(ORDERS).scan().to_arrow().to_pylist()
    accounts = catalog.load_table(ACCOUNTS).scan().to_arrow().to_pylist()
    assert len({r["id"] for r in accounts}) == len(accounts), "a key holds two rows"
    return (
        sorted((r["id"], r["cents"], r["coupon"]) for r in orders),
        {r["id"]: (r["owner"], r["status"]) for r in accounts},
    )


@pytest.mark.usefixtures("own_stores", "own_spark")
def test_the_app_on_a_hive_metastore_creates_evolves_applies_changes_and_is_maintained(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    server = HiveMetastore(tmp_path / "hive-metastore")
    state = server.start(timeout_s=300)
    try:
        settings = CatalogSettings(name="hms", type="hive", uri=state.uri, warehouse=state.warehouse_location)
        sink = new_sink(
            bootstrap_servers,
            tmp_path / "sink",
            settings,
            partitions={"orders": 1, "accounts": 2},
            prefix="hive",
            overrides={
                "tables": {
                    ORDERS: {"when": "kind == 'order'", "evolution": True},
                    ACCOUNTS: {
                        "when": "source.table == 'accounts'",
                        "changes": {"format": "debezium", "key": ["id"]},
                    },
                },
                "dynamic": None,
                "maintenance": {"min-input-files": 2, "orphan-older-than": "1d"},
            },
        )
        producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5})
        orders = _orders(producer, sink.topics["orders"])
        accounts = _changes(producer, sink.topics["accounts"])
        assert producer.flush(60) == 0

        log = sink.run("--available-now", "--max-offsets-per-trigger", "150")
        (tmp_path / "run.log").write_text(log)

        assert log.count(" committed (") >= 2, log[-3000:]
        table = load_catalog(settings).load_table(ORDERS)
        first, *later = table.metadata.schemas
        assert "coupon" not in first.column_names and later, "created without coupon, evolved afterwards"
        assert _pyiceberg(settings) == (orders, accounts)

        maintained = subprocess.run(
            [sys.executable, "-m", "fanout_sink.cli", "maintain", "--config", str(sink.config_file)],
            capture_output=True, text=True, timeout=600, check=False, env=child_env(None),
        )  # fmt: skip
        assert maintained.returncode == 0, maintained.stdout[-3000:] + maintained.stderr[-3000:]
        files = load_catalog(settings).load_table(ACCOUNTS).inspect.files().to_pylist()
        assert [f for f in files if f["content"] != 0] == [], "compaction folded the change table's deletes"
        assert _pyiceberg(settings) == (orders, accounts)

        script = tmp_path / "read.sql"
        script.write_text(
            f"SELECT id, cents, coupon FROM {ORDERS} ORDER BY id;\n"
            f"SELECT id, owner, status FROM {ACCOUNTS} ORDER BY id;\n"
        )
        done = run_sql_cli("--config", str(sink.config_file), "--format", "json", "-f", str(script))
        assert done.returncode == 0, done.stderr[-3000:]
        printed = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(r["id"], r["cents"], r["coupon"]) for r in printed if "cents" in r] == orders
        assert {r["id"]: (r["owner"], r["status"]) for r in printed if "owner" in r} == accounts
    finally:
        server.stop()
