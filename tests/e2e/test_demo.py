"""The README's main-job command, pointed at the test broker: every sample event lands in its table,
every malformed record in the dead-letter topic, and both engines show the tables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.devtools.demo import DEFAULT_CONFIG, malformed_events
from fanout_sink.devtools.sample_data import shop_events

pytestmark = pytest.mark.usefixtures("own_spark")


def test_demo_runs_the_app_and_shows_both_engines(
    bootstrap_servers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = 400
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    result = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "demo", "--bootstrap-servers", bootstrap_servers,
         "--dir", str(tmp_path / "demo"), "--records", str(records)],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    expected: dict[str, set[str]] = {}
    for event in shop_events(records):
        kind = event.key.decode().split("-")[0]
        expected.setdefault(f"shop.{kind}s", set()).add(event.key.decode())
    counts = {m[0]: int(m[1]) for m in re.findall(r"lake\.(shop\.\w+): (\d+) rows", result.stdout)}
    assert counts == {name: len(ids) for name, ids in expected.items()}
    assert f"dead-letter topic shop-demo-dlq: {len(malformed_events(0))} records" in result.stdout
    assert "through Spark SQL" in result.stdout and "revenue" in result.stdout

    monkeypatch.setenv("KAFKA_BOOTSTRAP", bootstrap_servers)
    monkeypatch.setenv("FANOUT_SINK_DEMO_DIR", str(tmp_path / "demo"))
    catalog = load_catalog(load_config(DEFAULT_CONFIG).catalog)
    for name, ids in expected.items():
        got = catalog.load_table(name).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        assert sorted(got) == sorted(ids), f"{name} holds exactly the produced events"
