"""The test command's own choices: which tier, how many pytest processes, and the totals it reports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fanout_sink import bootstrap

TESTS = Path(__file__).resolve().parent


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


def test_the_cores_busy_share_comes_from_proc_stat_idle_and_iowait_not_busy() -> None:
    before = bootstrap.cpu_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    after = bootstrap.cpu_ticks("cpu  400 0 150 1000 50 0 0 0 20 0\n")
    assert before == (150, 1000) and after == (550, 1600)
    assert bootstrap.busy_share(before, after) == 400 / 600
    assert bootstrap.busy_share(None, after) is None and bootstrap.busy_share(after, after) is None


def test_the_bench_tier_runs_alone_when_asked_and_with_the_full_tier_when_tests_bench_changed() -> None:
    assert bootstrap.selection("full", bench_is_new=False) == ("", False)
    assert bootstrap.selection("full", bench_is_new=True) == (bootstrap.WITH_BENCH, True)
    assert bootstrap.selection("bench", bench_is_new=False) == ("bench", True)
    assert bootstrap.selection("fast", bench_is_new=True) == (bootstrap.TIERS["fast"], False)
    assert bootstrap.selection("middle", bench_is_new=True) == (bootstrap.TIERS["middle"], False)
    assert bootstrap.choose_run(["--tier", "bench"]) == ("bench", 1, [])


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def test_the_bench_fingerprint_follows_every_file_git_would_keep_under_tests_bench(tmp_path: Path) -> None:
    bench = tmp_path / "tests" / "bench"
    bench.mkdir(parents=True)
    (bench / "run.py").write_text("print(1)\n")
    (tmp_path / "README.md").write_text("elsewhere\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    committed = bootstrap.bench_fingerprint(tmp_path)
    (bench / "__pycache__").mkdir()
    (bench / "__pycache__" / "run.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "README.md").write_text("changed, but not under tests/bench\n")
    assert bootstrap.bench_fingerprint(tmp_path) == committed  # ignored files and other folders
    (bench / "run.py").write_text("print(2)\n")
    edited = bootstrap.bench_fingerprint(tmp_path)
    assert edited != committed  # an uncommitted edit counts
    (bench / "new.py").write_text("")
    assert bootstrap.bench_fingerprint(tmp_path) != edited  # so does a new file git would track
    (bench / "new.py").unlink()
    assert bootstrap.bench_fingerprint(tmp_path) == edited
    shutil.rmtree(tmp_path / ".git")  # outside a checkout: the files themselves, compiled ones left out
    assert bootstrap.bench_fingerprint(tmp_path) == edited


def test_the_bench_tier_is_due_until_its_stamp_holds_the_fingerprint(tmp_path: Path) -> None:
    stamp = tmp_path / "bench-passed.sha256"
    assert bootstrap.bench_changed("abc", stamp)  # never passed: due
    stamp.write_text("abc\n")
    assert not bootstrap.bench_changed("abc", stamp)
    assert bootstrap.bench_changed("abd", stamp)
    stamp.write_text("")
    assert bootstrap.bench_changed("abc", stamp)


def test_the_current_stamp_is_a_fingerprint() -> None:
    """The committed stamp is what ``bench_fingerprint`` writes (whether it matches is the run's call)."""
    assert re.fullmatch(r"[0-9a-f]{64}\n", bootstrap.BENCH_PASSED.read_text())


def test_a_bench_test_runs_only_when_the_expression_names_bench(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.bench\ndef test_smoke(): pass\n\ndef test_product(): pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    bench: a smoke run\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

    def passed(*args: str) -> set[str]:
        cmd = [sys.executable, "-m", "pytest", "-p", "support.opt_in_markers", "-p", "no:cacheprovider"]
        result = subprocess.run(
            [*cmd, "-rA", "-q", *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return {line.split("::")[1] for line in result.stdout.splitlines() if line.startswith("PASSED ")}

    assert passed() == {"test_product"}
    assert passed("-m", bootstrap.TIERS["fast"]) == {"test_product"}
    assert passed("-m", bootstrap.TIERS["bench"]) == {"test_smoke"}
    assert passed("-m", bootstrap.WITH_BENCH) == {"test_smoke", "test_product"}


@pytest.mark.parametrize(("check_exit", "expected"), [(0, 0), (3, 3)])
def test_the_type_check_runs_beside_the_lanes_and_its_failure_decides_the_exit_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    check_exit: int,
    expected: int,
) -> None:
    """Both lanes run their test whatever the check says; the check's output is shown; its failure
    comes first, as it would have before the tests."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    for name, body in (("fanout-sink", "exit 0"), ("mypy", f"echo checked; exit {check_exit}")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "test_a.py").write_text("def test_1(): pass\n")
    (tmp_path / "test_b.py").write_text("def test_2(): pass\n")
    monkeypatch.setattr(bootstrap, "ROOT", tmp_path)
    monkeypatch.setattr(bootstrap, "VENV", tmp_path / ".venv")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    args = ["-p", "support.lanes", "-p", "no:cacheprovider"]
    assert bootstrap.run_lanes(2, args, beside=[str(bin_dir / "mypy")]) == expected
    printed = capsys.readouterr().out
    assert "checked" in printed and "tests: 2 passed, 0 failed" in printed
