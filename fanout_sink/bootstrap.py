"""The two newcomer commands, runnable with nothing but a system ``python3``.

``python3 -m fanout_sink.bootstrap demo`` and ``python3 -m fanout_sink.bootstrap test`` create the
repository's ``.venv`` when missing, (re)install the project into it when ``pyproject.toml``
changed, and then hand over to the real command inside the venv. Only the standard library may be
imported here: on a fresh machine nothing else is installed yet.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
_STAMP = VENV / ".fanout-sink-installed"
_MIN_PYTHON = (3, 11)


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
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
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
}
"""``test --tier NAME``: which tests run, by the markers the suite derives from each test's fixtures
(tests/support/fixture_markers.py). ``fast``: no broker and no JVM, for the inner loop of a change;
``middle``: adds the shared broker and the shared Spark session, for the usual change; ``full`` (the
default, what CI runs): everything, the app runs, the storage servers, the cluster and chaos too."""


def _tier(args: list[str]) -> tuple[str, list[str]]:
    """The ``--tier`` chosen (``full`` without one) and the arguments left for pytest."""
    parser = argparse.ArgumentParser(prog="bootstrap test", add_help=False, allow_abbrev=False)
    parser.add_argument("--tier", choices=TIERS, default="full")
    known, rest = parser.parse_known_args(args)
    return str(known.tier), rest


def run_tests(args: list[str]) -> int:
    """Lint, type-check, then the tier's pytest run; the first failing step decides the exit code."""
    tier, pytest_args = _tier(args)
    if TIERS[tier]:
        pytest_args = ["-m", TIERS[tier], *pytest_args]
    checks = [
        [str(_bin("ruff")), "check", "fanout_sink", "tests"],
        [str(_bin("ruff")), "format", "--check", "fanout_sink", "tests"],
        [str(_bin("mypy"))],
    ]
    for check in checks:
        code = _run(check)
        if code != 0:
            return code
    code = _run([str(_bin("python")), "-m", "pytest", *pytest_args])
    if code == 5:
        _say("pytest collected no tests: that counts as a failure")
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(
            "usage: python3 -m fanout_sink.bootstrap demo | test [--tier fast|middle|full] [pytest args]"
            " | <fanout-sink args>"
        )
        return 0 if args else 2
    ensure_venv()
    os.environ.setdefault("PYSPARK_PYTHON", str(_bin("python")))
    if args[0] == "test":
        return run_tests(args[1:])
    return _run([str(_bin("fanout-sink")), *args])


if __name__ == "__main__":
    sys.exit(main())
