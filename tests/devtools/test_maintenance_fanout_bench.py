"""The fan-out maintenance benchmark creates its tables, ranks them and runs ``maintain_run`` within
its ``max-duration``, reporting the order it took."""

from __future__ import annotations

from typing import Any

import pytest
from bench import maintenance_fanout

pytestmark = pytest.mark.bench


def test_benchmark_runs_end_to_end(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--tables", "3", "--max-files", "10", "--max-duration", "1ms"]
    assert maintenance_fanout.main(argv, spark=spark) == 0
    out = capsys.readouterr().out
    # Table i has 2 + 7i % 10 files: t00001 (9) first, t00002 (6) next time, t00000 (2) last.
    assert "maintained 1 of 3 table(s)" in out and "first next time bench.t00002" in out
    assert "- bench.t00001: data files 9 -> 1, snapshots 9 -> 1" in out
