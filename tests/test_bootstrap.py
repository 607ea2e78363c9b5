"""The test command's own choices: which tier, how many pytest processes, and the totals it reports."""

from __future__ import annotations

from fanout_sink import bootstrap


def test_the_whole_suite_runs_in_lanes_and_a_narrowed_run_in_one_process() -> None:
    assert bootstrap.choose_run([]) == ("full", len(bootstrap.LANES), [])
    assert bootstrap.choose_run(["-k", "worker", "-x"]) == ("full", 1, ["-k", "worker", "-x"])
    assert bootstrap.choose_run(["--tier", "fast"]) == ("fast", 1, [])
    assert bootstrap.choose_run(["--lanes", "1"]) == ("full", 1, [])


def test_the_lanes_split_the_suite_without_leaving_a_test_out() -> None:
    first, second = bootstrap.LANES
    assert second == f"not ({first})"


def test_totals_come_from_each_lanes_closing_line() -> None:
    log = "tests/x.py ..F\n=== short test summary ===\n=== 1 failed, 539 passed, 2 errors in 1854.63s ==="
    assert bootstrap.closing_counts(log) == {"failed": 1, "passed": 539, "error": 2}
    assert bootstrap.closing_counts("=== 12 passed, 3 deselected in 3.20s ===") == {
        "passed": 12,
        "deselected": 3,
    }
    assert bootstrap.closing_counts("interrupted before the end") == {}
