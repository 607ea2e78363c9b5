"""The driver JVM's standard error without its start-up notice: a process started inside
``jvm_stderr.filtered()`` writes through the filter, every other line reaches stderr unchanged."""

from __future__ import annotations

import subprocess

import pytest

from fanout_sink.spark import jvm_stderr

_NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector"


def test_a_process_started_inside_keeps_its_lines_but_the_jvm_notice(
    capfd: pytest.CaptureFixture[str],
) -> None:
    script = f"echo '{_NOTICE}' >&2; echo 'WARN SparkContext: kept' >&2; sleep 0.2; echo 'later' >&2"
    with jvm_stderr.filtered() as notice_filter:
        # Like PySpark's gateway: started inside, outlives the block, writes to its inherited stderr.
        child = subprocess.Popen(["sh", "-c", script])
    print("ours, after the block", file=__import__("sys").stderr)
    child.wait(30)
    assert notice_filter is not None and notice_filter.wait(30) == 0
    err = capfd.readouterr().err
    assert _NOTICE not in err
    assert "WARN SparkContext: kept\n" in err and "later\n" in err and "ours, after the block\n" in err
