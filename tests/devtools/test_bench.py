"""The slice-pipeline and record-CPU benchmarks run and print their markdown tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import record_cpu, slice_pipeline

pytestmark = pytest.mark.bench


def test_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.md"
    assert slice_pipeline.main(["--records", "500", "--repeat", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vectorised:" in printed and "per-record:" in printed and "records/s" in printed
    text = out.read_text()
    for topic in ("uniform", "mixed"):
        assert f"| {topic} | vectorised | 500 |" in text and f"| {topic} | per-record | 500 |" in text
    assert "MB/s" in text and "the mixed-type topic runs at" in text


def test_record_cpu_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--records", "2000", "--chunk", "1000", "--repeat", "1"]
    assert record_cpu.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| decode |" in printed and "| **total** |" in printed
    assert "mixed-50 costs" in printed
