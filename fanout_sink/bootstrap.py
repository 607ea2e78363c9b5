"""The two newcomer commands, runnable with nothing but a system ``python3``.

``python3 -m fanout_sink.bootstrap demo`` and ``python3 -m fanout_sink.bootstrap test`` create the
repository's ``.venv`` when missing, (re)install the project into it when ``pyproject.toml``
changed, and then hand over to the real command inside the venv. Only the standard library may be
imported here: on a fresh machine nothing else is installed yet.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
_STAMP = VENV / ".fanout-sink-installed"
_MIN_PYTHON = (3, 11)


INSTALL_INPUTS = ("pyproject.toml", "setup.py", "fanout_sink/kafka/librdkafka_arrow.c")
"""What an install of the project is made from: when one changes, ``.venv``'s install is redone (the
native range reader's C extension is compiled at install time; an editable install does not notice
its source change)."""


def _say(message: str) -> None:
    print(f"[bootstrap] {message}", file=sys.stderr, flush=True)


def _bin(name: str) -> Path:
    return VENV / "bin" / name


def ensure_venv() -> None:
    """Create ``.venv`` and install the project with its dev extras; a no-op when up to date."""
    if sys.version_info < _MIN_PYTHON:
        wanted_version = ".".join(map(str, _MIN_PYTHON))
        found = sys.version.split()[0]
        sys.exit(f"fanout_sink needs Python {wanted_version}+, this is {found}: run it with a newer python3.")
    wanted = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in INSTALL_INPUTS)).hexdigest()
    if _STAMP.exists() and _STAMP.read_text().strip() == wanted and _bin("fanout-sink").exists():
        return
    if not _bin("python").exists():
        _say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    _say("installing fanout-sink and its dependencies into .venv (first time: a few minutes)")
    pip = [str(_bin("python")), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-e", f"{ROOT}[dev]"], check=True)
    _STAMP.write_text(wanted + "\n")


def _run(cmd: list[str]) -> int:
    _say("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


TIERS = {
    "fast": "not (kafka or spark or own_spark or stores or cluster or chaos)",
    "middle": "not (own_spark or stores or cluster or chaos)",
    "full": "",
    "bench": "bench",
}
"""``test --tier NAME``: which tests run, by the markers the suite derives from each test's fixtures
(tests/support/fixture_markers.py). ``fast``: no broker and no JVM, for the inner loop of a change;
``middle``: adds the shared broker and the shared Spark session, for the usual change; ``full`` (the
default, what CI runs): everything, the app runs, the storage servers, the cluster and chaos too.
``bench``: only the benchmark harnesses' smoke runs (marker ``bench``, opt-in:
tests/support/opt_in_markers.py), which test the benchmarks, not the product; ``full`` adds them when
``tests/bench`` changed since they last passed (``bench_changed``)."""

WITH_BENCH = "bench or not bench"
"""The full tier's ``-m`` when it takes the bench tier too: naming ``bench`` opts its tests in."""

BENCH_PASSED = ROOT / "tests" / "bench-passed.sha256"
"""The fingerprint of ``tests/bench`` (``bench_fingerprint``) the last time every bench smoke run
passed. A content stamp rather than a ``git diff`` base: a fresh clone, a shallow one, a merge of two
branches or a squash all compare the same way, and any doubt (no stamp, a merge that changed the
folder) runs the bench tier rather than skipping it."""


def bench_fingerprint(root: Path = ROOT) -> str:
    """sha256 over the path and bytes of every file under ``tests/bench`` that git tracks or would
    track (uncommitted edits count; ignored files such as ``__pycache__`` do not). Outside a git
    checkout: every file there but compiled Python."""
    folder = root / "tests" / "bench"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "tests/bench"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        names = {name.decode() for name in listed.stdout.split(b"\0") if name}
    else:
        names = {
            path.relative_to(root).as_posix()
            for path in folder.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        }
    digest = hashlib.sha256()
    for name in sorted(names):
        path = root / name
        if path.is_file():  # a tracked file deleted in the work tree is gone from the fingerprint
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def bench_changed(fingerprint: str, stamp: Path = BENCH_PASSED) -> bool:
    """Whether ``tests/bench`` differs from what its smoke runs last passed on (no stamp: it does)."""
    recorded = stamp.read_text().split() if stamp.exists() else []
    return not recorded or recorded[0] != fingerprint


LANES = 4
"""The full tier runs as this many pytest processes at once (``--lane K/N``, tests/support/lanes.py).
The suite is mostly CPU-bound on the 2-core machine (JVM start-ups, Spark apps), with waits between
(restarts, kills, orphan-age margins): three lanes ran a clean clone's CI in 20 min 43 s (lanes of
1,154-1,168 s); five kept both cores at 0% idle, took 1,885-2,790 s each and pushed three JVM-heavy
tests past their timeouts. Each lane has its own broker and Spark session (session fixtures are per process);
nothing is shared but the jar cache, filled before the lanes start, and ``.pytest-lanes/claims``:
each lane takes the longest unit of tests no lane has taken yet, as it becomes free, by the seconds
each test took in an earlier run (``tests/durations.json``); each run writes its own to
``.pytest-lanes/durations.json``, which replaces that file to keep the order right."""

_SUMMARY = re.compile(r"^=+ (.*) in [0-9.]+s")
PROC_STAT = Path("/proc/stat")


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, all) clock ticks of every core since boot, from ``/proc/stat``'s first line: idle and
    iowait count as not busy; guest time is inside user time already, so only the first 8 are summed."""
    ticks = [int(field) for field in stat.split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The cores' busy share between two ``cpu_ticks`` readings (None when either is missing)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _cpu_now() -> tuple[int, int] | None:
    try:
        return cpu_ticks(PROC_STAT.read_text())
    except (OSError, ValueError, IndexError):  # not Linux
        return None


_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")


def choose_run(args: list[str]) -> tuple[str, int, list[str]]:
    """The ``--tier`` chosen (``full`` without one), the lanes, and the arguments left for pytest."""
    parser = argparse.ArgumentParser(prog="bootstrap test", add_help=False, allow_abbrev=False)
    parser.add_argument("--tier", choices=TIERS, default="full")
    parser.add_argument("--lanes", type=int, default=None)
    known, rest = parser.parse_known_args(args)
    if known.lanes is not None and known.lanes < 1:
        parser.error("--lanes takes a number of pytest processes, 1 or more")
    # Lanes only for the whole suite: a run narrowed by pytest arguments is one process, as typed.
    lanes = known.lanes or (LANES if known.tier == "full" and not rest else 1)
    return str(known.tier), lanes, rest


def selection(tier: str, bench_is_new: bool) -> tuple[str, bool]:
    """The tier's ``-m`` expression and whether it runs the bench smoke runs: the ``bench`` tier
    always, the ``full`` tier when ``tests/bench`` changed since they last passed, no other tier."""
    if tier == "full" and bench_is_new:
        return WITH_BENCH, True
    return TIERS[tier], tier == "bench"


def closing_counts(log: str) -> dict[str, int]:
    """The outcome counts of pytest's closing line in ``log`` (empty when it has none)."""
    for line in reversed(log.splitlines()):
        match = _SUMMARY.match(line.strip())
        if match:
            found: dict[str, int] = {}
            for number, kind in _COUNT.findall(match.group(1)):
                key = "error" if kind.startswith("error") else kind
                found[key] = found.get(key, 0) + int(number)
            return found
    return {}


def merge_durations(parts: list[Path], merged: Path) -> None:
    """One file of every lane's seconds per test, sorted, in the form ``tests/durations.json`` keeps."""
    seconds: dict[str, float] = {}
    for part in parts:
        if part.exists():
            seconds.update(json.loads(part.read_text()))
    merged.write_text(json.dumps(seconds, indent=0, sort_keys=True) + "\n")


def run_lanes(count: int, pytest_args: list[str], beside: list[str]) -> int:
    """Every lane at once, and the check ``beside`` with them: the first lane's output as it comes,
    the check's once it ended, the other lanes' once the first ended, then one line with the totals.
    The check's exit code if it failed (it comes before the tests), else 0 only when every lane passed
    (pytest's 5, no test collected, fails).

    The check (mypy: half a minute of one core in a fresh clone) runs beside the lanes rather than
    before them: alone it left the second core idle, beside them it takes what the lanes leave."""
    fetch = [str(_bin("fanout-sink")), "jars", "--all"]
    _say("$ " + " ".join(fetch))
    code = subprocess.run(fetch, cwd=ROOT, stdout=subprocess.DEVNULL, check=False).returncode
    if code != 0:  # its error went to stderr
        return code
    folder = ROOT / ".pytest-lanes"
    folder.mkdir(exist_ok=True)
    check_log = folder / f"{Path(beside[0]).name}.log"
    _say(f"beside the lanes, output in {check_log.name}: $ " + " ".join(beside))
    with check_log.open("w") as out:
        check = subprocess.Popen(beside, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    check_shown = False
    cpu_before = _cpu_now()
    logs = [folder / f"lane-{number}.log" for number in range(1, count + 1)]
    seconds = [folder / f"durations-{number}.json" for number in range(1, count + 1)]
    claims = folder / "claims"  # the lanes take the units as they go (tests/support/lanes.py)
    shutil.rmtree(claims, ignore_errors=True)
    processes = []
    for number, (log, timings) in enumerate(zip(logs, seconds, strict=True), start=1):
        lane = ["--lane", f"{number}/{count}", "--lane-claims", str(claims), "--durations-out", str(timings)]
        cmd = [str(_bin("python")), "-m", "pytest", *lane, *pytest_args]
        _say(f"{log.stem}: $ " + " ".join(cmd))
        with log.open("w") as out:
            processes.append(subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
    with logs[0].open() as first:  # follow the first lane's log while it runs
        while processes[0].poll() is None:
            sys.stdout.write(first.read())
            if not check_shown and check.poll() is not None:
                check_shown = _show_check(beside, check.returncode, check_log)
            sys.stdout.flush()
            time.sleep(1)
        sys.stdout.write(first.read())
    check_code = check.wait()
    if not check_shown:
        _show_check(beside, check_code, check_log)
    codes = [process.wait() for process in processes]
    share = busy_share(cpu_before, _cpu_now())
    for log in logs[1:]:
        _say(f"{log.stem}, its output:")
        print(log.read_text(), flush=True)
    totals: dict[str, int] = {}
    for log, code in zip(logs, codes, strict=True):
        counts = closing_counts(log.read_text())
        _say(f"{log.stem}: exit {code}, {counts or 'no closing line'}")
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    failed = totals.get("failed", 0) + totals.get("error", 0)
    merge_durations(seconds, folder / "durations.json")
    _say(f"each test's seconds: {folder / 'durations.json'} (copy it over tests/durations.json to rebalance)")
    if share is not None:  # whether the lanes left cores idle: then waits, not CPU, set the wall time
        _say(f"the {os.cpu_count()} cores were {share:.0%} busy while the lanes ran (every process counted)")
    print(f"tests: {totals.get('passed', 0)} passed, {failed} failed", flush=True)
    if 5 in codes:
        _say("a lane collected no tests: that counts as a failure")
    if check_code != 0:
        _say(f"{Path(beside[0]).name} failed (exit {check_code}): that decides the exit code")
        return check_code
    return next((code for code in codes if code != 0), 0)


def _show_check(cmd: list[str], code: int, log: Path) -> bool:
    """The check's output and exit code, between the first lane's lines."""
    _say(f"{Path(cmd[0]).name} (beside the lanes): exit {code}, its output:")
    print(log.read_text(), flush=True)
    return True


def run_tests(args: list[str]) -> int:
    """Lint, type-check, then the tier's pytest run; the first failing step decides the exit code
    (in lanes, the type check runs beside the tests: ``run_lanes``).
    A passing run of every bench smoke run (the bench tier, no pytest arguments narrowing it) records
    the fingerprint of the ``tests/bench`` it ran on in ``BENCH_PASSED``."""
    tier, lanes, pytest_args = choose_run(args)
    fingerprint = bench_fingerprint()
    expression, with_bench = selection(tier, bench_changed(fingerprint))
    if with_bench and tier == "full":
        _say(f"tests/bench is not what its smoke runs last passed on ({BENCH_PASSED.name}): they run too")
    stamps = with_bench and not pytest_args
    if expression:
        pytest_args = ["-m", expression, *pytest_args]
    checks = [
        [str(_bin("ruff")), "check", "fanout_sink", "tests"],
        [str(_bin("ruff")), "format", "--check", "fanout_sink", "tests"],
    ]
    typing = [str(_bin("mypy"))]
    if lanes == 1:  # in lanes it runs beside them
        checks.append(typing)
    for check in checks:
        code = _run(check)
        if code != 0:
            return code
    if lanes > 1:
        code = run_lanes(lanes, pytest_args, beside=typing)
    else:
        code = _run([str(_bin("python")), "-m", "pytest", *pytest_args])
        if code == 5:
            _say("pytest collected no tests: that counts as a failure")
    if code == 0 and stamps:
        BENCH_PASSED.write_text(fingerprint + "\n")
        _say(f"the bench smoke runs passed: commit {BENCH_PASSED.relative_to(ROOT)} with tests/bench")
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(
            "usage: python3 -m fanout_sink.bootstrap demo"
            " | test [--tier fast|middle|full|bench] [pytest args] | <fanout-sink args>"
        )
        return 0 if args else 2
    ensure_venv()
    os.environ.setdefault("PYSPARK_PYTHON", str(_bin("python")))
    if args[0] == "test":
        return run_tests(args[1:])
    return _run([str(_bin("fanout-sink")), *args])


if __name__ == "__main__":
    sys.exit(main())
