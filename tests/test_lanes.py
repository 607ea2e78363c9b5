"""The full run's lanes: each test in exactly one, the units kept whole, the long ones spread out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import lanes

TESTS = Path(__file__).resolve().parent


def test_units_go_longest_first_to_the_lane_with_the_least_so_far() -> None:
    chosen = lanes.deal({"a": 10.0, "b": 6.0, "c": 5.0, "d": 4.0, "e": 0.5}, 2)
    assert chosen == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}  # 14 and 11.5 seconds
    assert lanes.deal({}, 3) == {}
    assert set(lanes.deal({"x": 1.0, "y": 1.0, "z": 1.0}, 3).values()) == {0, 1, 2}


def test_a_lane_must_read_k_of_n() -> None:
    assert lanes.parse_lane("2/5") == (2, 5)
    for wrong in ("0/5", "6/5", "5", "a/b", "2/0"):
        with pytest.raises(pytest.UsageError, match="--lane"):
            lanes.parse_lane(wrong)


def _run(folder: Path, *args: str) -> set[str]:
    """The test ids a pytest run in ``folder`` passed (``-rA`` lines), the lane plugin loaded by ``-p``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "support.lanes", "-p", "no:cacheprovider", "-rA", "-q", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASSED ")}


def test_every_test_runs_in_exactly_one_lane_with_its_module(tmp_path: Path) -> None:
    """Unknown tests weigh the same: the module of three goes alone, the two smaller ones share."""
    (tmp_path / "test_a.py").write_text("def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n")
    (tmp_path / "test_b.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    (tmp_path / "test_c.py").write_text("def test_1(): pass\n")
    first = _run(tmp_path, "--lane", "1/2", "--durations-out", str(tmp_path / "out" / "1.json"))
    second = _run(tmp_path, "--lane", "2/2")
    assert first == {"test_a.py::test_1", "test_a.py::test_2", "test_a.py::test_3"}
    assert second == {"test_b.py::test_1", "test_b.py::test_2", "test_c.py::test_1"}
    assert set(json.loads((tmp_path / "out" / "1.json").read_text())) == first
    assert _run(tmp_path) == first | second  # without --lane: everything


class _Item:
    """What ``units_of`` reads of a collected test: its id and its fixture closure."""

    def __init__(self, nodeid: str, *fixtures: str) -> None:
        self.nodeid, self.fixturenames = nodeid, list(fixtures)


def test_modules_on_the_spark_session_or_the_tls_broker_share_one_process_each_whole() -> None:
    items = [
        _Item("tests/a.py::t1", "spark"),
        _Item("tests/a.py::t2"),  # its module's other test goes with it
        _Item("tests/b.py::t1", "spark", "tmp_path"),
        _Item("tests/c.py::t1", "tls_broker"),
        _Item("tests/c.py::t2"),
        _Item("tests/d.py::t1", "spark", "object_store_process"),  # the servers' unit wins
        _Item("tests/d.py::t2"),
        _Item("tests/e.py::t1", "kafka_broker"),
    ]
    units = lanes.units_of(items)  # type: ignore[arg-type]
    assert units == ["spark session"] * 3 + ["tls broker"] * 2 + ["stores", "tests/d.py", "tests/e.py"]
