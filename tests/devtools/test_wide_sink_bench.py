"""The wide-sink benchmark runs its rounds with the real worker and coordinator and reports them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import wide_sink

pytestmark = pytest.mark.bench


def test_benchmark_runs(bootstrap_servers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wide.json"
    argv = [
        *("--tables", "6", "--partitions", "4", "--records", "12", "--tables-per-slice", "3"),
        *("--rounds", "2", "--bootstrap-servers", bootstrap_servers, "--out", str(out)),
        *("--work-dir", str(tmp_path / "work")),
    ]
    assert wide_sink.main(argv) == 0
    data = json.loads(out.read_text())
    rounds = data["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        # Partition p feeds tables p, p+1, p+2 (mod 6): 4 partitions reach all 6 tables.
        assert (r["records"], r["slices"], r["tables_committed"]) == (48, 4, 6)
        # Each table read from the pointer the round's one query found: no load_table.
        assert r["coordinator_catalog_calls"] == {"commit_table": 6}
        # StartCommit, a DataWritten per table and slice (12), a DataComplete per slice (4), a
        # CommitToTable per table (6), CommitComplete.
        assert r["control_messages"] == 1 + 12 + 4 + 6 + 1 and r["control_bytes"] > 0
        assert r["worker_s_per_table_slice"] > 0 and r["coordinator_cpu_ms_per_table"] > 0
        assert 0 < r["commit_thread_cpu_ms_per_table"] <= r["coordinator_cpu_ms_per_table"]
    # From the second round on, the workers load no table: their re-check before each transaction
    # reads the SQL catalog's pointers in one query (``current_table_uuids``), not a load per table.
    assert rounds[1]["worker_catalog_calls"] == {}
    printed = capsys.readouterr().out
    assert "| round | tables committed | coordinator round s |" in printed
    assert "commit interval: met" in printed or "commit interval: NOT met" in printed
