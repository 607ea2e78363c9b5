"""The app's PySpark daemon (``spark.python.daemon.module``): a task's imports paid once per executor.

PySpark starts one daemon per executor, which forks a Python worker for every task slot. With its
own daemon (``pyspark.daemon``) each forked worker imports the sink (pyarrow, pyiceberg and the
pandas it pulls in, confluent_kafka, pydantic models) when it unpickles its first task: the same
imports once per slot, about 0.4 CPU seconds each on this machine (docs/benchmarks/cpu.md). This
daemon imports them before it forks, so the workers inherit them, and then runs PySpark's daemon
unchanged. The imports' objects are frozen out of the cyclic garbage collector first: no collection
in a worker walks them, and the pages holding them stay shared with the daemon after the fork.

PySpark's worker calls ``importlib.invalidate_caches()`` before every task. On CPython 3.11 that
makes every zip importer on the path (one per package imported from ``pyspark.zip``: 14 and more)
read the whole zip's directory again, 60-180 ms of CPU per task; 3.12 made it lazy (gh-103200).
Here a zip importer reads its archive again only when the file changed (its size, mtime or inode).

Only what a module import does happens before the fork: no client, thread or connection exists yet
(each worker builds its own executor state, see :mod:`.task`).

The workers run without pandas (:mod:`fanout_sink.refused_imports`): the daemon refuses it before
it loads the task's modules; 35 MB of RSS and 0.26 CPU s in every Python process of every executor.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import zipimport
from collections.abc import Callable

from pyspark import daemon

from fanout_sink.refused_imports import NEVER_IMPORTED, RefuseImports

TASK_MODULE = "fanout_sink.spark.task"

_ArchiveState = tuple[int, int, int]


def _archive_state(path: str) -> _ArchiveState | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def reread_only_changed_archives(
    reread: Callable[[zipimport.zipimporter], None],
) -> Callable[[zipimport.zipimporter], None]:
    """``zipimporter.invalidate_caches`` that calls ``reread`` (the original) only for an importer
    whose archive changed since it last read it (or that never read it through here)."""
    seen: dict[tuple[str, str], _ArchiveState] = {}

    def invalidate_caches(importer: zipimport.zipimporter) -> None:
        key = (importer.archive, importer.prefix)
        state = _archive_state(importer.archive)
        if state is not None and seen.get(key) == state:
            return
        reread(importer)
        if state is not None:
            seen[key] = state

    return invalidate_caches


def main() -> None:
    sys.meta_path.insert(
        0, RefuseImports(NEVER_IMPORTED, "fanout_sink's Spark workers (spark/worker_daemon.py)")
    )
    importlib.import_module(TASK_MODULE)  # before the fork: the workers inherit it
    if sys.version_info < (3, 12):
        original = zipimport.zipimporter.invalidate_caches
        zipimport.zipimporter.invalidate_caches = reread_only_changed_archives(original)  # type: ignore[method-assign,assignment]
        importlib.invalidate_caches()  # every importer reads once here; the forked workers inherit it
    gc.collect()
    gc.freeze()
    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
