"""The benchmark's memory figures per run (issue 26, item 1): the tree's peak RSS split by process
kind with each kind's process count, the tree's PSS beside its RSS, and the report's table of them."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from bench.proctree import run_child
from bench.report import Measurement, markdown

# A parent that starts two children holding 150 MB each (touched, so resident) for six seconds: the
# sampler reads PSS every 2 s, so a 2 s hold could fall between two PSS reads on a busy machine (CI
# saw a peak PSS of 163 MB beside an RSS of 334 MB); six seconds give it three reads.
_TREE = textwrap.dedent(
    """
    import subprocess, sys
    hold = "b = bytearray(150_000_000); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(6)"
    children = [subprocess.Popen([sys.executable, "-c", hold]) for _ in range(2)]
    for child in children:
        child.wait()
    """
)


def test_a_trees_memory_is_reported_per_process_kind_with_its_pss(tmp_path: Path) -> None:
    run = run_child([sys.executable, "-c", _TREE], env={}, log=tmp_path / "log")
    assert run.returncode == 0, run.stderr
    assert run.role_processes == {"driver Python": 1, "other": 2}
    assert run.role_rss_mb["other"] > 2 * 150, run.role_rss_mb
    assert 0 < run.role_rss_mb["driver Python"] < 150, run.role_rss_mb
    assert run.peak_rss_mb >= run.role_rss_mb["other"]
    # PSS counts the interpreter's pages the three share once, so it stays below the RSS sum.
    assert 2 * 150 < run.peak_pss_mb < run.peak_rss_mb, (run.peak_pss_mb, run.peak_rss_mb)


# A parent holding 300 MB that forks short-lived children (50 ms each, one after another, for 3 s):
# each child's RSS shows the parent's pages it shares, as a JVM's child does between fork and exec.
_FORKING = textwrap.dedent(
    """
    import os, time
    b = bytearray(300_000_000); b[::4096] = b'x' * len(b[::4096])
    stop = time.monotonic() + 3
    while time.monotonic() < stop:
        pid = os.fork()
        if pid == 0:
            time.sleep(0.05)
            os._exit(0)
        os.waitpid(pid, 0)
    """
)


def test_a_child_shorter_than_a_sample_does_not_count_its_parents_pages_twice(tmp_path: Path) -> None:
    run = run_child([sys.executable, "-c", _FORKING], env={}, log=tmp_path / "log")
    assert run.returncode == 0, run.stderr
    assert 300 < run.peak_rss_mb < 450, run.peak_rss_mb
    assert run.role_processes == {"driver Python": 1}, run.role_processes


def _measurement(system: str, roles: dict[str, float] | None) -> Measurement:
    return Measurement(
        cores=2,
        variant="uniform-3",
        round=0,
        system=system,
        records=1_000_000,
        megabytes=244.0,
        wall_s=10.0,
        cpu_s=20.0,
        peak_rss_mb=1_500.0,
        worker_rss_mb=400.0,
        steady_s=None,
        files_per_table=[1],
        snapshots_per_table=[1],
        pss_mb=1_200.0 if roles else None,
        role_rss_mb=roles or {},
        role_processes={kind: 2 if kind == "Python workers" else 1 for kind in roles or {}},
    )


def test_the_report_shows_each_kinds_peak_and_count_and_the_trees_pss() -> None:
    roles = {"driver JVM": 300.0, "Python workers": 800.0, "driver Python": 250.0}
    text = markdown(
        {
            "measurements": [
                vars(_measurement("ours", roles)),
                # A run recorded before these figures existed (older results.json) still loads.
                {
                    k: v
                    for k, v in vars(_measurement("older", None)).items()
                    if k not in {"pss_mb", "role_rss_mb", "role_processes"}
                },
            ]
        }
    )
    assert "## Memory by process kind" in text
    header = next(
        line for line in text.splitlines() if line.startswith("| cores | variant | system | peak RSS tree")
    )
    assert header.endswith("| driver JVM MB | Python workers MB | driver Python MB |")
    assert "| 2 | uniform-3 | ours | 1,500 | 1,200 | 1 x 300 | 2 x 800 | 1 x 250 |" in text
    assert "| older | 1,500 |" not in text, "no memory row for a run without per-kind figures"
