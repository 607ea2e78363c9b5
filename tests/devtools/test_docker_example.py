"""docker/sink.yaml, the compose file's example, run for real so that it cannot drift from what works:
the compose sink's own command (``fanout-sink demo --config docker/sink.yaml``) on the very file, its
variables pointed at this test's servers instead of the compose services: Iceberg's REST catalog (the
stack's, started here so that the example's table names are its own) on the S3 store, a private broker
(the example's topic names, empty), and a local master instead of the cluster.

Then through PyIceberg: every produced event in its table exactly once, the tables created with the
example's partition specs, and ``shop.orders`` evolved by the sink (its select's ``item_count``, which
the schema file lacks, added as a column and filled).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from chaos.app_process import child_env
from pyiceberg.transforms import DayTransform, IdentityTransform

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.devtools.sample_data import shop_events
from fanout_sink.devtools.stack import object_store as store_env
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.devtools.stack.object_store import ObjectStoreState
from fanout_sink.devtools.stack.rest_catalog import RestCatalog, RestCatalogState
from fanout_sink.devtools.stack.spark_cluster import MASTER_ENV

pytestmark = pytest.mark.usefixtures("own_spark", "own_stores")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docker" / "sink.yaml"
REST_URI_ENV = "FANOUT_SINK_REST_URI"
"""docker/sink.yaml's catalog URI variable (default: the compose service ``rest``)."""
RECORDS = 300


@pytest.fixture
def rest_catalog(tmp_path: Path, object_store: ObjectStoreState) -> Iterator[RestCatalogState]:
    """A REST catalog of the test's own on the session's S3 store, its tables in a bucket of their own."""
    server = RestCatalog(tmp_path / "rest", object_store, f"docker-{uuid.uuid4().hex[:8]}")
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_compose_example_creates_partitioned_tables_evolves_one_and_lands_every_event(
    broker_factory: Callable[..., KafkaBroker],
    object_store: ObjectStoreState,
    rest_catalog: RestCatalogState,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = broker_factory()
    env = {
        REST_URI_ENV: rest_catalog.uri,
        store_env.ENDPOINT_ENV: object_store.endpoint,
        store_env.ACCESS_KEY_ENV: object_store.access_key_id,
        store_env.SECRET_KEY_ENV: object_store.secret_access_key,
        MASTER_ENV: "local[2]",
    }
    done = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "demo", "--bootstrap-servers", broker.bootstrap_servers,
         "--config", str(EXAMPLE), "--dir", str(tmp_path / "data"), "--records", str(RECORDS)],
        capture_output=True, text=True, env=child_env(env), timeout=540, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]

    for name, value in {**env, "KAFKA_BOOTSTRAP": broker.bootstrap_servers}.items():
        monkeypatch.setenv(name, value)
    config = load_config(EXAMPLE)
    catalog = load_catalog(config.catalog)
    expected: dict[str, list[str]] = {}
    for event in shop_events(RECORDS):  # the demo's events, ids from 0 on an empty topic
        expected.setdefault(f"shop.{event.key.decode().split('-')[0]}s", []).append(event.key.decode())
    assert set(expected) == set(config.tables)
    for name, ids in expected.items():
        got = catalog.load_table(name).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        assert sorted(got) == sorted(ids), f"{name}: every produced event exactly once"

    orders, payments = catalog.load_table("shop.orders"), catalog.load_table("shop.payments")
    [day] = orders.spec().fields
    assert isinstance(day.transform, DayTransform) and orders.schema().find_column_name(day.source_id) == "ts"
    [method] = payments.spec().fields
    assert isinstance(method.transform, IdentityTransform)
    assert payments.schema().find_column_name(method.source_id) == "method"

    # Created from the schema file, then evolved by the sink: a second schema holds item_count.
    assert len(orders.schemas()) == 2 and "item_count" not in orders.schemas()[0].column_names
    rows = orders.scan(selected_fields=("items", "item_count")).to_arrow().to_pylist()
    assert rows and all(row["item_count"] == len(row["items"]) for row in rows)
