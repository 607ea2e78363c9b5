"""Options for the driver JVM that PySpark launches: a class-data-sharing archive, and C1 for the app.

Measured on a 2-core machine: creating the sink's Spark session and its Kafka source costs the driver
JVM about 23 CPU seconds before the first batch can run, most of it loading and verifying Spark's
classes and compiling them with both JIT tiers. Two JDK features cut it without touching Spark:

* **A dynamic AppCDS archive** (JDK 13+): the first JVM that exits cleanly dumps the classes it
  loaded (``-XX:ArchiveClassesAtExit``); later JVMs map them (``-XX:SharedArchiveFile``). 23 → 6 CPU s.
  A truncated archive crashes the JVM (SIGBUS) instead of being ignored, so the dump goes to a file
  of its own and is published by rename only after that JVM exited with status 0; a start that still
  fails with an archive deletes it and starts again without one. A JVM may also refuse an archive
  without a word (``-Xshare:auto``: a class path or jar that differs from the dump's), and then starts
  as slowly as with none: after the start the JVM's mappings are read, and an archive it was offered
  and did not map is deleted with a warning, so the next clean exit dumps a fresh one.
* **C1 only** (``-XX:TieredStopAtLevel=1``, with the serial collector and a 64 MB code cache: see
  :mod:`.footprint`) for the app: its driver JVM plans offsets and keeps the
  checkpoint; records never pass through it (each Python task reads its range from the broker), so
  the optimising compiler never pays back its compile threads. Sessions that run queries (tests, the
  demo's Spark SQL) keep the default JIT.

The archive is keyed by the JDK, PySpark and the class path: anything else would make the JVM refuse
it (silently, with ``-Xshare:auto``) or, worse, map a stale one. ``FANOUT_SINK_CDS=0`` turns it off.
Every new virtualenv, PySpark or jar set therefore makes a new archive of 100-220 MB; only the
:data:`ARCHIVES_KEPT` most recently used are kept (one machine here had gathered 89, 15 GB).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fanout_sink import jars
from fanout_sink.processes import pid_alive

log = logging.getLogger(__name__)

LIGHT_JIT = "-XX:TieredStopAtLevel=1"
PLANNING_GC = "-XX:+UseSerialGC"
"""The app's collector: G1 grows a heap toward its maximum and keeps it; a planning heap stays small
with the serial one (see :mod:`.footprint`). Left out when the user's options choose a collector: the
JVM refuses two."""
PLANNING_OPTIONS = (
    "-XX:ReservedCodeCacheSize=64m",
    "-Xms32m",
    "-XX:MinHeapFreeRatio=10",
    "-XX:MaxHeapFreeRatio=30",
)
"""With C1 only, the default 240 MB code cache is never needed; a planning heap uses about 50 MB, and
the default initial heap (1/64 of the machine's memory) has the first young generation touched in
full before the first collection: start small and give back what a collection frees (the JVM's peak
went from 424 to 330 MB with these, docs/benchmarks/memory.md)."""
_CHOOSES_GC = re.compile(r"-XX:\+Use\w*GC\b")
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""Dumping lists every class it skips as a warning (hundreds of lines); none of them is actionable."""
_DUMP_WAIT_S = 120.0
ARCHIVES_KEPT = 12
"""Archives kept in the cache, most recently used first (use touches an archive's mtime). Twelve, at
100-230 MB each: the test suite alone starts drivers on more class paths than six (with and without
the object-store jars, the Python planner without Kafka's, each checkout's own PySpark), and with six
its lanes evicted each other's archives: one run saw the app's archive dumped again twice in ten
minutes, every miss paying a start without it and a dump at exit (70-120 s of a loaded machine)."""


def java_home() -> Path | None:
    """The JDK home a ``java`` started now would run: ``JAVA_HOME``, else the ``java`` on PATH's."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else None


def _fingerprint(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def archive_path(classpath: Sequence[str]) -> Path | None:
    """Where the archive for this JDK, PySpark and class path lives; None without a JDK on PATH."""
    import pyspark

    home = java_home()
    if home is None:
        return None
    libjvm = next(iter(sorted(home.glob("lib/server/libjvm.so"))), home / "lib/server/libjvm.so")
    # Resolved: a home that reaches its JDK's files through links (the tests' launch guard, a
    # `java` wrapper with a `lib` link beside it) runs the same JVM, so it maps the same archive.
    parts = [
        _fingerprint(libjvm.resolve()),
        pyspark.__version__,
        str(Path(pyspark.__file__).parent),
        *classpath,
    ]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return jars.cache_dir() / "jvm" / f"spark-driver-{digest}.jsa"


def _mark_used(archive: Path) -> None:
    """The mtime says when an archive was last mapped, so pruning keeps the ones in use."""
    with contextlib.suppress(OSError):  # a read-only cache still works; pruned by publication time
        os.utime(archive)


def prune_archives(folder: Path, keep: int = ARCHIVES_KEPT) -> list[Path]:
    """Delete all but the ``keep`` most recently used archives; the ones deleted. A JVM mapping a
    deleted archive keeps its mapping (the inode lives on until it exits)."""
    archives = sorted(folder.glob("spark-driver-*.jsa"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for stale in archives[keep:]:
        stale.unlink(missing_ok=True)
    return archives[keep:]


def maps_file(pid: int, path: Path) -> bool | None:
    """Whether process ``pid`` has ``path`` mapped (Linux's ``/proc/<pid>/maps``, which names files by
    their resolved path, ``(deleted)`` after a newer archive replaced it); None where that cannot be
    read (another OS, a process gone)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    real = path.resolve()
    return f" {real}\n" in maps or f" {real} (deleted)\n" in maps


def _remove_abandoned_dumps(folder: Path) -> None:
    """Dumps of JVMs that were killed before publishing them (``<archive>.<pid>.dump``)."""
    for dump in folder.glob("*.dump"):
        pid = dump.suffixes[-2].lstrip(".") if len(dump.suffixes) >= 2 else ""
        if not (pid.isdigit() and pid_alive(int(pid))):
            dump.unlink(missing_ok=True)


@dataclass(frozen=True)
class DriverJvm:
    """The class-data-sharing part of one driver JVM's options: map ``archive``, or dump one for it."""

    archive: Path | None
    dumping: bool

    @classmethod
    def plan(cls, classpath: Sequence[str]) -> DriverJvm:
        archive = None if os.environ.get("FANOUT_SINK_CDS", "1") == "0" else archive_path(classpath)
        if archive is None:
            return cls(None, dumping=False)
        archive.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_dumps(archive.parent)
        if archive.exists():
            _mark_used(archive)
            return cls(archive, dumping=False)
        return cls(archive, dumping=True)

    @property
    def dump(self) -> Path | None:
        """This process's own dump file: no other JVM ever maps it before it is complete."""
        return self.archive.with_name(f"{self.archive.name}.{os.getpid()}.dump") if self.archive else None

    def options(self) -> str:
        if self.archive is None:
            return ""
        if self.dumping:
            return f"-XX:ArchiveClassesAtExit={self.dump} {_QUIET_CDS}"
        return f"-XX:SharedArchiveFile={self.archive} {_QUIET_CDS}"

    def discard(self) -> None:
        """The JVM did not start with the archive: it must not be offered again."""
        if self.archive is not None and not self.dumping:
            log.warning("the driver JVM failed to start with the class archive %s; deleted it", self.archive)
            self.archive.unlink(missing_ok=True)

    def check_mapped(self, pid: int) -> str:
        """What the started JVM ``pid`` did with the archive, in words for the session's start line.
        An archive it was offered and did not map is deleted: the JVM refused it, and every start
        with it would pay the classes' loading again (a JVM CPU of ~9 s instead of ~5 s to the first
        batch, docs/benchmarks/many-topics-side-by-side.md)."""
        if self.archive is None:
            return "no class archive"
        if self.dumping:
            return "no class archive yet: dumping one at a clean exit"
        mapped = maps_file(pid, self.archive)
        if mapped is None:
            return f"class archive {self.archive.name}"
        if mapped:
            return f"class archive {self.archive.name} mapped"
        log.warning(
            "the driver JVM refused its class archive %s (a class path or jar unlike the dump's) and "
            "started without it; deleted it, so the next clean exit dumps a new one. To see why: "
            "-Xlog:cds=info,class+path=info in spark.driver.extraJavaOptions",
            self.archive,
        )
        self.archive.unlink(missing_ok=True)
        return "class archive refused"

    def publish_at_exit(self, session: Any) -> None:
        """Publish the dump once the session's JVM exited cleanly (run when this process exits)."""
        if self.dumping:
            atexit.register(self._publish, session)

    def _publish(self, session: Any) -> None:
        dump, archive = self.dump, self.archive
        assert dump is not None and archive is not None
        proc = getattr(session.sparkContext._gateway, "proc", None)
        if proc is None:  # not a JVM PySpark launched (spark-submit): it was not told to dump
            return
        status = None
        try:
            session.stop()
            if proc.stdin is not None:
                proc.stdin.close()  # the gateway JVM exits when its stdin closes, and dumps then
            status = proc.wait(timeout=_DUMP_WAIT_S)
        except Exception:  # at exit: a JVM that is gone already just publishes nothing
            log.debug("the driver JVM did not exit cleanly; its class archive is not kept", exc_info=True)
        if status == 0 and dump.exists():
            os.replace(dump, archive)
            for stale in prune_archives(archive.parent):
                log.debug("deleted the least recently used class archive %s", stale)
        else:
            dump.unlink(missing_ok=True)


def driver_java_options(jvm: DriverJvm, light_jit: bool, user_options: str | None) -> str:
    """``spark.driver.extraJavaOptions``: ours first, the user's last (the JVM takes the last of a flag).

    ``light_jit`` is the app's planning-only JVM: C1 only, the serial collector (unless the user's
    options choose one), a small code cache and a heap that starts small and shrinks."""
    ours: tuple[str, ...] = ()
    if light_jit:
        gc = () if _CHOOSES_GC.search(user_options or "") else (PLANNING_GC,)
        ours = (LIGHT_JIT, *gc, *PLANNING_OPTIONS)
    return " ".join(part for part in (*ours, jvm.options(), user_options or "") if part)
