"""The test command's own choices: which tier, how many pytest processes, and the totals it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout_sink import bootstrap


def test_the_whole_suite_runs_in_lanes_and_a_narrowed_run_in_one_process() -> None:
    assert bootstrap.choose_run([]) == ("full", bootstrap.LANES, [])
    assert bootstrap.choose_run(["-k", "worker", "-x"]) == ("full", 1, ["-k", "worker", "-x"])
    assert bootstrap.choose_run(["--tier", "fast"]) == ("fast", 1, [])
    assert bootstrap.choose_run(["--lanes", "1"]) == ("full", 1, [])
    assert bootstrap.choose_run(["--lanes", "3"]) == ("full", 3, [])
    with pytest.raises(SystemExit):
        bootstrap.choose_run(["--lanes", "0"])


def test_the_lanes_seconds_merge_into_one_sorted_file(tmp_path: Path) -> None:
    (tmp_path / "1.json").write_text(json.dumps({"tests/b.py::t": 2.0}))
    (tmp_path / "2.json").write_text(json.dumps({"tests/a.py::t": 1.5}))
    parts = [tmp_path / "1.json", tmp_path / "2.json", tmp_path / "lost.json"]
    bootstrap.merge_durations(parts, tmp_path / "m.json")
    text = (tmp_path / "m.json").read_text()
    assert json.loads(text) == {"tests/a.py::t": 1.5, "tests/b.py::t": 2.0}
    assert text.index("a.py") < text.index("b.py")


def test_totals_come_from_each_lanes_closing_line() -> None:
    log = "tests/x.py ..F\n=== short test summary ===\n=== 1 failed, 539 passed, 2 errors in 1854.63s ==="
    assert bootstrap.closing_counts(log) == {"failed": 1, "passed": 539, "error": 2}
    assert bootstrap.closing_counts("=== 12 passed, 3 deselected in 3.20s ===") == {
        "passed": 12,
        "deselected": 3,
    }
    assert bootstrap.closing_counts("interrupted before the end") == {}
