"""A child process measured as a whole process tree: wall, CPU seconds and peak RSS.

``RUSAGE_CHILDREN`` alone misses what the child did not reap (Spark's Python workers, a JVM's
threads are fine but a daemon's forks are not always waited for), so a thread samples ``/proc``
for the child and every descendant: CPU per pid (the last value seen: a process's CPU only grows)
and RSS summed over the live processes at each sample, also per role (driver JVM, driver Python, Python
workers: :func:`.process_cpu.role`) with the number of each role's processes, and the tree's PSS
(forked workers share pages with their daemon, which RSS counts once per process).

Memory counts a process from its second sample on: a child caught between fork and exec shows its
parent's whole RSS (a 30-minute soak caught the driver JVM spawning a command: +442 MB in one sample,
the whole "growth" that judged it), and nothing that lives under one sampling interval holds memory
of its own that matters for a peak. CPU counts every process seen.

The sum of per-pid CPU misses each process's last sampling interval and processes shorter than one;
``wait4``'s rusage misses descendants nobody reaped. Both are lower bounds, so the larger one is reported.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.process_cpu import read_all, read_pss_mb, role, tree_of

_SAMPLE_S = 0.2
_PSS_EVERY = 10
"""PSS is read every this many samples (2 s): ``smaps_rollup`` walks a process's every mapping in the
kernel, and read for a JVM and its Python workers every 0.2 s it cost the harness more CPU than all
else (py-spy, bench.wide_app at 5,000 tables: half of the harness's samples), CPU the measured
system then lacked. RSS, from ``stat``, stays every sample."""
_STOP_GRACE_S = 120.0


@dataclass
class TreeUsage:
    """What the sampler saw of one process tree: peaks, and the latest sample (the soak mode reads
    ``rss_mb`` and ``largest_rss_mb`` while the child runs, so it needs no second sampler)."""

    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    peak_worker_rss_mb: float = 0.0
    peak_pss_mb: float = 0.0
    role_rss_mb: dict[str, float] = field(default_factory=dict)
    """Per role, the peak of its processes' RSS summed at one sample."""
    role_processes: dict[str, int] = field(default_factory=dict)
    """Per role, the most processes of it alive at one sample."""
    rss_mb: float = 0.0
    largest_rss_mb: float = 0.0
    role_now_mb: dict[str, float] = field(default_factory=dict)
    """Per role, its processes' RSS summed at the latest sample."""
    role_by_pid: dict[int, str] = field(default_factory=dict)
    """Each process's role at its second sample (a fork shows its parent's command line until it
    execs, an exiting process an empty one); a process seen once counts as "other"."""
    last_pids: frozenset[int] = frozenset()
    """The processes of the previous sample: only these count towards memory in the next one."""
    samples: int = 0

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_pid.values())

    def role_cpu_s(self) -> dict[str, float]:
        """CPU seconds per role: what splits a run's CPU into the JVM's, the workers' and the driver's."""
        total: dict[str, float] = defaultdict(float)
        for pid, seconds in self.cpu_by_pid.items():
            total[self.role_by_pid.get(pid, "other")] += seconds
        return dict(total)


@dataclass(frozen=True)
class ChildRun:
    """One measured child: wall seconds until done, CPU seconds and RSS of its tree, its output."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    peak_worker_rss_mb: float
    returncode: int
    stderr: str
    peak_pss_mb: float = 0.0
    role_rss_mb: dict[str, float] = field(default_factory=dict)
    """Per role (driver JVM, driver Python, Python workers), the peak of its processes' summed RSS."""
    role_processes: dict[str, int] = field(default_factory=dict)
    role_cpu_s: dict[str, float] = field(default_factory=dict)
    """Per role, its processes' CPU seconds (summed from the samples: a lower bound, see the module)."""

    def failure(self, system: str, log: Path, what: str = "failed") -> SystemExit:
        """The benchmark's stop for a system that did not finish its run: the exit code and log tail."""
        return SystemExit(f"{system} {what} (exit {self.returncode}); log {log}:\n{self.stderr[-3000:]}")


def _sample(root: int, usage: TreeUsage) -> None:
    stats = read_all()
    rss = pss = largest = 0.0
    with_pss = usage.samples % _PSS_EVERY == 0
    usage.samples += 1
    by_role: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    pids = frozenset(tree_of(root, stats) & stats.keys())
    for pid in pids:
        stat = stats[pid]
        usage.cpu_by_pid[pid] = max(stat.cpu_s, usage.cpu_by_pid.get(pid, 0.0))
        if pid not in usage.last_pids:
            continue  # not yet in two samples: maybe a fork still showing its parent's pages
        kind = role(pid, root)
        # Kept from the second sample on: an exiting process's command line reads empty.
        usage.role_by_pid.setdefault(pid, kind)
        rss += stat.rss_mb
        largest = max(largest, stat.rss_mb)
        if with_pss:
            pss += read_pss_mb(pid) or 0.0
        by_role[kind] += stat.rss_mb
        count[kind] += 1
        if kind == "Python workers":
            usage.peak_worker_rss_mb = max(usage.peak_worker_rss_mb, stat.rss_mb)
    usage.last_pids = pids
    usage.peak_rss_mb = max(usage.peak_rss_mb, rss)
    usage.peak_pss_mb = max(usage.peak_pss_mb, pss)
    usage.rss_mb, usage.largest_rss_mb, usage.role_now_mb = rss, largest, dict(by_role)
    for kind, mb in by_role.items():
        usage.role_rss_mb[kind] = max(usage.role_rss_mb.get(kind, 0.0), mb)
        usage.role_processes[kind] = max(usage.role_processes.get(kind, 0), count[kind])


def _taskset() -> str:
    found = shutil.which("taskset")
    if found is None:
        raise SystemExit("--taskset: no taskset program on PATH; fix: install util-linux, or run unpinned")
    return found


def run_child(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    done: Callable[[], bool] | None = None,
    timeout_s: float = 3600.0,
    cpus: str | None = None,
    usage: TreeUsage | None = None,
) -> ChildRun:
    """Run ``command`` and measure its tree until it exits, or, with ``done``, until ``done()`` holds.

    With ``done`` the wall time ends when it first holds; the child then gets SIGTERM (its CPU up to
    the exit still counts). The largest single RSS among Spark's Python workers is reported as the
    worker's peak. The child's stderr and stdout go to ``log``. ``cpus`` (``taskset -c`` syntax, e.g.
    ``0`` or ``0-1``) pins the child at launch, so every process it starts (a JVM, Spark's Python
    workers) inherits the pinning. ``usage``, when given, is filled as the child runs.
    """
    usage = usage if usage is not None else TreeUsage()
    pinned = [_taskset(), "-c", cpus] if cpus else []
    with log.open("w") as out:
        started = time.monotonic()
        child = subprocess.Popen([*pinned, *command], stdout=out, stderr=subprocess.STDOUT, env=dict(env))
        stop = threading.Event()

        def sampler() -> None:
            while not stop.is_set():
                _sample(child.pid, usage)
                stop.wait(_SAMPLE_S)

        thread = threading.Thread(target=sampler, name="proctree-sampler", daemon=True)
        thread.start()
        wall: float | None = None
        kill_at = float("inf")
        try:
            while True:
                pid, status, rusage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    child.returncode = os.waitstatus_to_exitcode(status)
                    break
                now = time.monotonic()
                if wall is None and done is not None and done():
                    wall, kill_at = now - started, now + _STOP_GRACE_S
                    child.send_signal(signal.SIGTERM)
                elif wall is None and now - started > timeout_s:
                    raise TimeoutError(f"{command[:4]} did not finish within {timeout_s:.0f}s; log: {log}")
                elif now > kill_at:
                    child.kill()
                time.sleep(0.25)
            wall = wall if wall is not None else time.monotonic() - started
        finally:
            stop.set()
            thread.join()
            if child.returncode is None:
                child.kill()
                child.wait()
    reaped = rusage.ru_utime + rusage.ru_stime
    return ChildRun(
        wall_s=wall,
        cpu_s=max(usage.cpu_s, reaped),
        peak_rss_mb=usage.peak_rss_mb,
        peak_worker_rss_mb=usage.peak_worker_rss_mb,
        returncode=child.returncode,
        stderr=log.read_text(errors="replace"),
        peak_pss_mb=usage.peak_pss_mb,
        role_rss_mb=dict(usage.role_rss_mb),
        role_processes=dict(usage.role_processes),
        role_cpu_s=usage.role_cpu_s(),
    )
