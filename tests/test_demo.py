"""The README's main-job command, pointed at the test broker: every produced event ends in a table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.sample_data import shop_events

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_demo_lands_every_sample_event_and_shows_both_engines(bootstrap_servers: str, tmp_path: Path) -> None:
    records = 300
    result = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "demo", "--bootstrap-servers", bootstrap_servers,
         "--dir", str(tmp_path / "demo"), "--records", str(records)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {m[0]: int(m[1]) for m in re.findall(r"lake\.demo\.(\w+): (\d+) rows", result.stdout)}
    expected: dict[str, set[str]] = {}
    for event in shop_events(records):
        kind = event.key.decode().split("-")[0]
        expected.setdefault(f"{kind}s", set()).add(event.key.decode())
    assert counts == {name: len(ids) for name, ids in expected.items()}
    assert "through Spark SQL" in result.stdout and "revenue" in result.stdout

    catalog = load_catalog(
        CatalogSettings(name="lake", uri=f"sqlite:///{tmp_path / 'demo' / 'catalog.db'}",
                        warehouse=f"file://{tmp_path / 'demo' / 'warehouse'}")
    )  # fmt: skip
    for name, ids in expected.items():
        got = catalog.load_table(f"demo.{name}").scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        assert sorted(got) == sorted(ids), f"demo.{name} holds exactly the produced {name}"
