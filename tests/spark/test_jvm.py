"""The driver JVM's class-data-sharing archive: published only when complete, mapped, and never fatal.

Real: each step starts a real driver JVM through PySpark in a child process (the archive is per
process, written at JVM exit); the only substitution is the archive's folder (a temporary one, via
``jvm.archive_path`` in the child), so the user's cache is left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fanout_sink.spark import jvm

pytestmark = pytest.mark.usefixtures("own_spark")

_CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from fanout_sink.spark import jvm
    jvm.archive_path = lambda classpath: Path(sys.argv[1])
    from fanout_sink.spark.session import build_spark_session, spark_conf
    # A class path unlike the dump's (a jar first), when given: the JVM refuses the archive.
    path = os.pathsep.join([*sys.argv[2:], spark_conf(None)["spark.driver.extraClassPath"]])
    spark = build_spark_session(
        master="local[1]", light_jit=True, extra_conf={"spark.driver.extraClassPath": path}
    )
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    args = runtime.getInputArguments()
    print("JVM-ARGS", " ".join(str(a) for a in args))
    print("MAPPED", jvm.maps_file(runtime.getPid(), Path(sys.argv[1])))
    print("SUM", spark.range(10).groupBy().sum().collect()[0][0])
    """
)


@pytest.fixture
def start_session_in_child() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts children (see ``_start_session_in_child``); those still running at the end are killed
    with their JVMs."""
    started: list[subprocess.Popen[str]] = []

    def start(archive: Path, *first_on_class_path: Path) -> subprocess.Popen[str]:
        started.append(_start_session_in_child(archive, *first_on_class_path))
        return started[-1]

    yield start
    for child in started:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _start_session_in_child(archive: Path, *first_on_class_path: Path) -> subprocess.Popen[str]:
    """Runs in the archive's folder: a JVM that crashes on a damaged archive leaves its hs_err log there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.pop("FANOUT_SINK_CDS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(archive), *map(str, first_on_class_path)],
        cwd=archive.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its group holds the JVM too: a failed test kills both
    )


def _jvm_args(child: subprocess.Popen[str]) -> str:
    """The child's JVM options and whether it mapped the archive, once its session ran a job and it
    exited cleanly; with its standard error."""
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr[-3000:]
    assert "SUM 45" in stdout
    lines = [line for line in stdout.splitlines() if line.startswith(("JVM-ARGS", "MAPPED"))]
    return "\n".join([*lines, stderr])


def _copy(archive: Path, folder: Path, size: int | None = None) -> Path:
    """A copy of ``archive`` (its first ``size`` bytes) in a folder of its own under ``folder``."""
    folder.mkdir()
    copy = folder / archive.name
    copy.write_bytes(archive.read_bytes()[:size])
    return copy


def test_the_archive_is_published_after_a_clean_exit_mapped_next_time_and_a_damaged_or_refused_one_is_dropped(
    tmp_path: Path, start_session_in_child: Callable[..., subprocess.Popen[str]]
) -> None:
    archive = tmp_path / "driver.jsa"

    first = _jvm_args(start_session_in_child(archive))
    assert "-XX:ArchiveClassesAtExit=" in first and jvm.LIGHT_JIT in first and jvm.PLANNING_GC in first
    assert "MAPPED False" in first
    assert archive.stat().st_size > 1_000_000, "the dump was not published"
    assert not list(tmp_path.glob("*.dump")), "the dump file stayed behind"

    # A truncated archive crashes a JVM that maps it (SIGBUS); the session starts again without it.
    # A complete one under a class path unlike the dump's is refused without a word (-Xshare:auto).
    # Each is a copy in a folder of its own, so that mapping the complete archive runs at the same time.
    damaged = _copy(archive, tmp_path / "damaged", archive.stat().st_size // 2)
    refused = _copy(archive, tmp_path / "refused")
    jar = tmp_path / "first.jar"
    with zipfile.ZipFile(jar, "w") as empty:
        empty.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    children = [
        start_session_in_child(archive),
        start_session_in_child(damaged),
        start_session_in_child(refused, jar),
    ]
    second, third, fourth = (_jvm_args(child) for child in children)

    assert f"-XX:SharedArchiveFile={archive}" in second and "MAPPED True" in second
    assert "SharedArchiveFile" not in third
    assert not damaged.exists(), "the damaged archive is offered again"
    assert f"-XX:SharedArchiveFile={refused}" in fourth and "MAPPED False" in fourth
    assert "refused its class archive" in fourth
    assert not refused.exists(), "the refused archive is offered again"


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


def test_only_the_most_recently_used_archives_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each virtualenv or jar set has its own archive (100-220 MB): the cache must not grow without end."""
    archives = [tmp_path / f"spark-driver-{n:016x}.jsa" for n in range(jvm.ARCHIVES_KEPT + 3)]
    for age, archive in enumerate(reversed(archives)):
        archive.write_bytes(b"classes")
        os.utime(archive, (1_000_000 + age, 1_000_000 + age))  # archives[0] is the newest
    other = tmp_path / "something-else.jsa"
    other.write_bytes(b"not ours")
    oldest = archives[-1]
    monkeypatch.setattr(jvm, "archive_path", lambda classpath: oldest)
    assert jvm.DriverJvm.plan([]) == jvm.DriverJvm(oldest, dumping=False)  # mapped: now the most recent

    removed = jvm.prune_archives(tmp_path)

    assert sorted(removed) == sorted(archives[jvm.ARCHIVES_KEPT - 1 : -1])
    assert sorted(tmp_path.glob("spark-driver-*.jsa")) == sorted([oldest, *archives[: jvm.ARCHIVES_KEPT - 1]])
    assert other.exists()


def test_a_home_linking_to_a_jdks_lib_maps_that_jdks_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests' launch guard is such a home (its ``bin/java`` a wrapper, its ``lib`` the JDK's): keyed
    by its own path, every session's guard made the driver JVMs dump archives of their own at exit."""
    real = jvm.java_home()
    assert real is not None and (real / "lib").is_dir()
    (tmp_path / "lib").symlink_to(real / "lib", target_is_directory=True)
    monkeypatch.setenv("JAVA_HOME", str(real))
    through_the_jdk = jvm.archive_path(["a.jar"])
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert jvm.archive_path(["a.jar"]) == through_the_jdk
    (tmp_path / "lib").unlink()  # another JDK (here: none) keys another archive
    assert jvm.archive_path(["a.jar"]) != through_the_jdk
