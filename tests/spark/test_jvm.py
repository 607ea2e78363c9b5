"""The driver JVM's class-data-sharing archive: published only when complete, mapped, and never fatal.

Real: each step starts a real driver JVM through PySpark in a child process (the archive is per
process, written at JVM exit); the only substitution is the archive's folder (a temporary one, via
``jvm.archive_path`` in the child), so the user's cache is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fanout_sink.spark import jvm

pytestmark = pytest.mark.spark

_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fanout_sink.spark import jvm
    jvm.archive_path = lambda classpath: Path(sys.argv[1])
    from fanout_sink.spark.session import build_spark_session
    spark = build_spark_session(master="local[1]", light_jit=True)
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    args = runtime.getInputArguments()
    print("JVM-ARGS", " ".join(str(a) for a in args))
    print("SUM", spark.range(10).groupBy().sum().collect()[0][0])
    """
)


def _session_in_child(archive: Path) -> str:
    """Runs in the archive's folder: a JVM that crashes on a damaged archive leaves its hs_err log there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.pop("FANOUT_SINK_CDS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(archive)],
        cwd=archive.parent,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SUM 45" in result.stdout
    return next(line for line in result.stdout.splitlines() if line.startswith("JVM-ARGS"))


def test_the_archive_is_published_after_a_clean_exit_mapped_next_time_and_a_damaged_one_is_dropped(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "driver.jsa"

    first = _session_in_child(archive)
    assert "-XX:ArchiveClassesAtExit=" in first and jvm.LIGHT_JIT in first
    assert archive.stat().st_size > 1_000_000, "the dump was not published"
    assert not list(tmp_path.glob("*.dump")), "the dump file stayed behind"

    second = _session_in_child(archive)
    assert f"-XX:SharedArchiveFile={archive}" in second

    # A truncated archive crashes a JVM that maps it (SIGBUS); the session starts again without it.
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    third = _session_in_child(archive)
    assert "SharedArchiveFile" not in third
    assert not archive.exists(), "the damaged archive is offered again"


def test_dumps_of_killed_jvms_are_removed_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "driver.jsa"
    monkeypatch.setattr(jvm, "archive_path", lambda classpath: archive)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f"driver.jsa.{dead.pid}.dump"
    abandoned.write_bytes(b"half")
    live = tmp_path / f"driver.jsa.{os.getppid()}.dump"
    live.write_bytes(b"still writing")

    planned = jvm.DriverJvm.plan([])

    assert planned.dumping and planned.dump == tmp_path / f"driver.jsa.{os.getpid()}.dump"
    assert not abandoned.exists() and live.exists()
    archive.write_bytes(b"complete")
    assert jvm.DriverJvm.plan([]) == jvm.DriverJvm(archive, dumping=False)
    monkeypatch.setenv("FANOUT_SINK_CDS", "0")
    assert jvm.DriverJvm.plan([]).options() == ""
