"""The maintenance benchmark streams its hour with the real worker and coordinator, measures every
table before and after maintenance, and writes its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench import maintenance

pytestmark = pytest.mark.bench


def test_benchmark_runs_end_to_end(bootstrap_servers: str, spark: Any, tmp_path: Path) -> None:
    rounds, partitions, records, tables = 4, 2, 20, 2
    argv = [
        *("--rounds", str(rounds), "--tables", str(tables), "--records", str(records)),
        *("--repeat", "1", "--bootstrap-servers", bootstrap_servers, "--out", str(tmp_path)),
        *("--work-dir", str(tmp_path / "work"), "--keep-minutes", "0", "--min-input-files", "2"),
    ]
    assert maintenance.main(argv, spark=spark) == 0
    data = json.loads((tmp_path / "maintenance.json").read_text())
    assert data["ingest"]["records"] == rounds * partitions * records
    before = data["before"]
    assert [t["table"] for t in before] == ["bench.t00", "bench.t01"]
    for table in before:
        assert table["rows"] == rounds * partitions * records // tables
        # One file per slice and hour partition, one snapshot and one manifest per commit round.
        assert rounds * partitions <= table["data_files"] <= 2 * rounds * partitions
        assert table["snapshots"] == rounds and table["manifests"] == table["live_manifests"] == rounds
        assert table["metadata_bytes"] > 0 and 0 < table["filtered_rows"] < table["rows"]
        assert set(table["scan_s"]) == set(maintenance.SCANS)

    after = {t["table"]: t for t in data["after"]}
    for old in before:
        new = after[old["table"]]
        # The same rows, in fewer and larger files, with the expired snapshots gone.
        assert (new["rows"], new["filtered_rows"]) == (old["rows"], old["filtered_rows"])
        assert new["data_files"] < old["data_files"] and new["snapshots"] < old["snapshots"]
    maintained = {t["table"]: t for t in data["maintenance"]["tables"]}
    assert set(maintained) == set(after)
    for table in maintained.values():
        actions = {step["name"]: step["action"] for step in table["steps"]}
        assert actions["compact"] == "ran" and actions["expire"] == "ran", table["steps"]
    assert data["maintenance"]["settings"]["min-input-files"] == 2

    text = (tmp_path / "maintenance.md").read_text()
    assert "PYTHONPATH=tests python -m bench.maintenance --rounds 4" in text
    assert "| bench.t01 | " in text and " → " in text and "records/s" in text
    assert "| data files | " in text and "## What maintenance did" in text
