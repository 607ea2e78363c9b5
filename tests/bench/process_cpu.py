"""CPU seconds of a process tree split by role: driver JVM, Spark's Python workers, driver Python.

Where an app's CPU goes is the first question of a throughput change (issue 12: most of it was the
JVM's Kafka source and the Arrow stream into the Python workers). The tree is sampled from
``/proc`` while it runs (Linux only); every process counts with the last CPU time seen, so a
process that ends between two samples loses at most one interval (Spark reuses its Python workers,
so little is lost).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROLES = ("driver JVM", "Python workers", "driver Python", "other")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 1e6


@dataclass(frozen=True)
class ProcStat:
    """One process as ``/proc/<pid>/stat`` shows it."""

    parent: int
    cpu_s: float  # user + system
    rss_mb: float


def read_stat(pid: int) -> ProcStat | None:
    """One process's parent, CPU and RSS; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may contain spaces
    return ProcStat(int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE_MB)


def read_pss_mb(pid: int) -> float | None:
    """One process's proportional set size (its private pages plus its share of pages it shares with
    others, such as a forked Python worker's with its daemon): the tree's PSS sums to what it really
    occupies, where RSS counts a shared page once per process. None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1000  # kB
    return None


def read_all() -> dict[int, ProcStat]:
    """Every live process."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    return stats


def tree_of(root: int, stats: dict[int, ProcStat]) -> set[int]:
    """``root`` and its live descendants."""
    tree, grew = {root}, True
    while grew:
        children = {pid for pid, stat in stats.items() if stat.parent in tree} - tree
        tree |= children
        grew = bool(children)
    return tree & (stats.keys() | {root})


def role(pid: int, root: int) -> str:
    """What a process of an app's tree is: one of ``ROLES``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "driver Python" if pid == root else "other"
    if argv[0].endswith(b"java"):
        return "driver JVM"  # also a JVM peer's root (the Kafka Connect worker)
    if pid == root:
        return "driver Python"
    if b"pyspark.daemon" in argv or b"pyspark.worker" in argv:
        return "Python workers"
    return "other"


class ProcessTreeCpu:
    """Samples the tree under ``root`` every ``interval_s`` until :meth:`stop`; :meth:`by_role` sums."""

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self.root = root
        self.interval_s = interval_s
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-tree-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        stats = read_all()
        for pid in tree_of(self.root, stats) & stats.keys():
            # Asked every time: a child shows its parent's command line until it execs.
            self._seen[pid] = (role(pid, self.root), stats[pid].cpu_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def by_role(self) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for role, seconds in self._seen.values():
            total[role] += seconds
        return {role: total[role] for role in ROLES}
