"""The backlog benchmark drains a small produced backlog with fanout_sink and reports it exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import backlog

pytestmark = [pytest.mark.usefixtures("own_spark"), pytest.mark.bench]


def test_benchmark_drains_a_backlog_and_writes_its_report(bootstrap_servers: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "backlog.md").write_text("# Catch-up\n\nHand-written analysis.\n")
    argv = [
        *("--records", "1500", "--tables", "4", "--partitions", "2", "--systems", "ours"),
        *("--commit-interval", "1", "--max-offsets-per-trigger", "500", "--sample-interval", "1"),
        *("--bootstrap-servers", bootstrap_servers, "--out", str(out), "--work-dir", str(tmp_path / "work")),
    ]
    assert backlog.main(argv) == 0
    (run,) = json.loads((out / "backlog.json").read_text()).values()
    (ours,) = run["systems"]
    assert ours["system"] == backlog.OURS and ours["exact_tables"] == 4
    assert ours["exact"] == {"produced": 1500, "rows": 1500, "duplicates": 0, "missing": 0, "misrouted": 0}
    assert 0 < ours["first_visible_s"] <= ours["drain_s"]
    # 1,500 records in micro-batches of at most 500: the bounded batches the drain is made of.
    assert sum(b[0] for b in ours["batches"]) == 1500 and max(b[0] for b in ours["batches"]) <= 500
    assert ours["rounds"] and all(r["tables"] <= 4 for r in ours["rounds"])
    assert ours["cpu_s"] > 0 and ours["peak_rss_mb"] > 0 and ours["samples"]
    text = (out / "backlog.md").read_text()
    assert text.startswith("# Catch-up\n\nHand-written analysis.\n") and backlog.MARKER in text
    assert "| fanout_sink |" in text and "first table visible within 120 s" in text
