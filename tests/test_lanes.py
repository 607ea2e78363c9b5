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


def test_lanes_taking_units_as_they_go_run_each_test_once_and_keep_their_session(tmp_path: Path) -> None:
    """Two lanes at once on one claims folder: every test runs in exactly one, a module whole; each lane
    builds its session fixture once however many units it takes, and a module's fixture is torn down
    before the next unit starts. Alone, a lane takes every unit, the longest first."""
    (tmp_path / "conftest.py").write_text(
        "import os, pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def shared():\n"
        "    with open(f'session-{os.getpid()}', 'a') as f: f.write('up\\n')\n"
        "@pytest.fixture(scope='module')\n"
        "def mod(request, shared):\n"
        "    with open(f'modules-{os.getpid()}', 'a') as f: f.write(f'up {request.module.__name__}\\n')\n"
        "    yield\n"
        "    with open(f'modules-{os.getpid()}', 'a') as f: f.write(f'down {request.module.__name__}\\n')\n"
    )
    sizes = {"a": 3, "b": 2, "c": 1, "d": 1}
    for module, count in sizes.items():
        tests = "".join(f"def test_{i}(mod): __import__('time').sleep(0.2)\n" for i in range(count))
        (tmp_path / f"test_{module}.py").write_text(tests)
    # A fixture started at collection by the lanes whose session.items hold it: one lane takes it then.
    (tmp_path / "test_e.py").write_text(
        "import pytest\n@pytest.fixture\ndef expired(): pass\ndef test_0(expired): pass\n"
    )
    sizes["e"] = 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

    def lane(k: int, claims: str) -> subprocess.Popen[str]:
        plugins = ["-p", "support.lanes", "-p", "no:cacheprovider", "-rA", "-q"]
        command = [sys.executable, "-m", "pytest", *plugins, "--lane", f"{k}/2", "--lane-claims", claims]
        return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)

    lanes_run = [lane(1, "claims"), lane(2, "claims")]
    outputs = [run.communicate(timeout=120)[0] for run in lanes_run]
    assert [run.returncode for run in lanes_run] == [0, 0], outputs
    ran = [{line.split()[1] for line in out.splitlines() if line.startswith("PASSED ")} for out in outputs]
    everything = {f"test_{m}.py::test_{i}" for m, count in sizes.items() for i in range(count)}
    assert ran[0] | ran[1] == everything and not ran[0] & ran[1]
    assert sum("1 deselected" in out for out in outputs) == 1, (
        "the other lane dropped test_e.py at collection"
    )
    modules = [{test.split("::")[0] for test in tests} for tests in ran]
    assert not modules[0] & modules[1], "a module whole in one lane"
    for session in tmp_path.glob("session-*"):
        assert session.read_text() == "up\n", "one session per lane, kept across its units"
    for events in tmp_path.glob("modules-*"):
        lines = events.read_text().splitlines()
        assert lines[0::2] == [line.replace("down", "up") for line in lines[1::2]], (
            "torn down before the next"
        )

    alone = lane(1, "alone")
    out = alone.communicate(timeout=120)[0]
    assert alone.returncode == 0, out
    assert "lane 1 took: test_a.py, test_b.py, test_c.py, test_d.py, test_e.py" in out, out


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
