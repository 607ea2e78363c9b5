"""Moving over from the Iceberg Kafka Connect sink (issue 35 item 4): the real connector (Connect
standalone from Maven Central jars, ``bench.connect_peer``) writes the first part of a stream, is
refused a takeover while it runs, is stopped; ``fanout-sink import-connect --take-over`` turns its
config into a sink YAML and seeds the sink group from the connector's group; the app finishes the
stream with ``--available-now``. Every record lands exactly once: no id missing, none twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from bench import connect_peer
from bench.proctree import run_child
from chaos.app_process import child_env
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from support.common import create_named_topic, produce_json

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.cli import main
from fanout_sink.config.loading import load_config
from fanout_sink.connect_import import takeover, translator

pytestmark = pytest.mark.usefixtures("own_spark")

FIRST, SECOND = 1200, 800  # records the connector writes, then the records the sink finishes with
TABLES = {"shop.orders": "order", "shop.payments": "payment"}
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "kind", StringType(), required=False),
    NestedField(3, "note", StringType(), required=False),
)


def _produce(bootstrap: str, topic: str, ids: range) -> None:
    for partition in (0, 1):
        values = [
            {"id": i, "kind": "order" if i % 3 else "payment", "note": f"n{i}"}
            for i in ids
            if i % 2 == partition
        ]
        produce_json(bootstrap, topic, partition, values)


def _ids(settings: CatalogSettings) -> Counter[int]:
    catalog = load_catalog(settings, create=False)
    found: Counter[int] = Counter()
    for table in TABLES:
        found.update(catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())
    return found


def test_the_sink_takes_over_from_the_stopped_connector_and_finishes_the_stream_exactly_once(
    bootstrap_servers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"kc-takeover-{int(time.time() * 1000)}"
    topic = create_named_topic(bootstrap_servers, f"{name}-events", partitions=2)
    control = f"{name}-control"
    connect_peer.create_control_topic(bootstrap_servers, control)
    settings = CatalogSettings(
        name="lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}"
    )
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    for table in TABLES:
        catalog.create_table(table, schema=SCHEMA)
    connector = {
        "name": name,
        "connector.class": translator.APACHE_CLASS,
        "tasks.max": "2",
        "topics": topic,
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "iceberg.tables": ",".join(TABLES),
        "iceberg.tables.route-field": "kind",
        **{f"iceberg.table.{table}.route-regex": kind for table, kind in TABLES.items()},
        "iceberg.control.topic": control,
        "iceberg.control.commit.interval-ms": "2000",
        **connect_peer.catalog_properties(settings),
        "iceberg.kafka.bootstrap.servers": bootstrap_servers,
    }
    (tmp_path / "connector.json").write_text(json.dumps({"name": name, "config": connector}))
    imported = translator.translate(connector)
    (tmp_path / "early.yaml").write_text(imported.yaml())
    early = load_config(tmp_path / "early.yaml")
    _produce(bootstrap_servers, topic, range(FIRST))

    refusals: list[str] = []
    last_look = [0.0]

    def connector_done() -> bool:
        if time.monotonic() - last_look[0] < 1.0:
            return False
        last_look[0] = time.monotonic()
        try:
            if sum(_ids(settings).values()) < FIRST:
                return False
        except Exception:  # the Java side may be mid-commit on the SQLite file
            return False
        try:  # while Connect runs, the takeover is refused, naming what to do
            takeover.take_over(imported, early)
        except translator.ImportError_ as exc:
            refusals.append(str(exc))
        return True

    folder = tmp_path / "connect"
    folder.mkdir()
    command = connect_peer.standalone_command(folder, bootstrap_servers, 2.0, connector)
    run_child(command, env=child_env(), log=folder / connect_peer.LOG, done=connector_done, timeout_s=300)
    written = _ids(settings)
    assert sorted(written) == list(range(FIRST)) and max(written.values()) == 1, "the connector's part"
    assert refusals and "still runs" in refusals[0] and "stop it first" in refusals[0], refusals

    _produce(bootstrap_servers, topic, range(FIRST, FIRST + SECOND))  # the rest of the stream
    out = tmp_path / "sink.yaml"
    code = main(["import-connect", str(tmp_path / "connector.json"), "--out", str(out), "--take-over"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"took over {topic}[0] at offset" in err and f"took over {topic}[1] at offset" in err, err

    result = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(out), "--available-now"],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    landed = _ids(settings)
    missing = sorted(set(range(FIRST + SECOND)) - set(landed))
    twice = sorted(i for i, n in landed.items() if n > 1)
    assert not missing and not twice, f"missing {missing[:20]}, twice {twice[:20]}"
    assert set(landed) == set(range(FIRST + SECOND))

    # A second takeover is refused: the sink group holds offsets now.
    assert main(["import-connect", str(tmp_path / "connector.json"), "--out", str(out), "--take-over"]) == 2
    assert "already holds offsets" in capsys.readouterr().err
