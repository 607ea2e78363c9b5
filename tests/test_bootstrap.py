"""The test command's own choices: which tier, how many pytest processes, and the totals it reports."""

from __future__ import annotations

import itertools
import re

from _pytest.mark.expression import Expression

from fanout_sink import bootstrap


def test_the_whole_suite_runs_in_lanes_and_a_narrowed_run_in_one_process() -> None:
    assert bootstrap.choose_run([]) == ("full", len(bootstrap.LANES), [])
    assert bootstrap.choose_run(["-k", "worker", "-x"]) == ("full", 1, ["-k", "worker", "-x"])
    assert bootstrap.choose_run(["--tier", "fast"]) == ("fast", 1, [])
    assert bootstrap.choose_run(["--lanes", "1"]) == ("full", 1, [])


def test_the_lanes_split_the_suite_without_leaving_a_test_out() -> None:
    """Every combination of the markers the lanes name is selected by exactly one lane."""
    names = sorted(set(re.findall(r"[a-z_]+", " ".join(bootstrap.LANES))) - {"and", "or", "not"})
    lanes = [Expression.compile(lane) for lane in bootstrap.LANES]
    for held in itertools.product((False, True), repeat=len(names)):
        markers = {name for name, on in zip(names, held, strict=True) if on}
        chosen = [lane.evaluate(lambda name, held=frozenset(markers), **_: name in held) for lane in lanes]
        assert chosen.count(True) == 1, (sorted(markers), chosen)


def test_totals_come_from_each_lanes_closing_line() -> None:
    log = "tests/x.py ..F\n=== short test summary ===\n=== 1 failed, 539 passed, 2 errors in 1854.63s ==="
    assert bootstrap.closing_counts(log) == {"failed": 1, "passed": 539, "error": 2}
    assert bootstrap.closing_counts("=== 12 passed, 3 deselected in 3.20s ===") == {
        "passed": 12,
        "deselected": 3,
    }
    assert bootstrap.closing_counts("interrupted before the end") == {}
