"""The app's memory defaults: a driver JVM sized for planning, Python workers on allocators that give
memory back. Measured in docs/benchmarks/memory.md (1M records, 2 cores: the process tree's peak RSS).

* **Driver heap 512 MB** (``spark.driver.memory``; Spark's default is 1 GB, and the smallest it starts
  with is 450 MB). The app's driver JVM plans offsets, keeps the checkpoint and ships one small row
  per slice; records never pass through it (each Python task reads its range from the broker).
* **Serial GC, a 64 MB code cache, a heap that starts at 32 MB and shrinks**
  (``spark.driver.extraJavaOptions``, :mod:`.jvm`): G1 grows the heap toward its maximum and keeps
  it; the serial collector keeps a planning heap (about 50 MB used) small, and with C1 only the
  default 240 MB code cache is never needed. The JVM's peak went from 983 to 424 MB with the heap
  limit, collector and code cache, to 330 MB with the small initial heap.
* **Workers' allocators** (``spark.executorEnv.*``, so the same on a cluster's executors as in
  local mode): Arrow's jemalloc pool instead of mimalloc (pyarrow's default, which kept about 75 MB
  more per worker after a slice), glibc limited to 2 arenas and a fixed mmap threshold (librdkafka's
  fetch buffers are then mapped and returned instead of fragmenting the heap).

* **The driver Python's allocator** (:func:`limit_driver_arenas`): the same glibc limits, set with
  ``mallopt`` when the app starts, as the driver Python is already running when it could read them
  from its environment. The coordinator parses and copies each table's metadata in short-lived
  commit threads, each of which would otherwise get an arena of its own. The soaks with this limit
  and snapshot expiry still saw the driver Python grow about 1.9 MB a minute (docs/benchmarks/soak.md).

Every value is a default: the YAML's ``spark.conf`` and ``--conf`` of ``fanout-sink run`` override it.
Under ``spark-submit`` the driver JVM is started by the submit command, so its heap and options must be
given there (``--driver-memory``, ``--driver-java-options``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

DRIVER_MEMORY = "512m"

WORKER_ENV = {
    "ARROW_DEFAULT_MEMORY_POOL": "jemalloc",
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": "131072",
}
"""Environment of the Python workers (their daemon reads it when Spark starts it)."""

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameters (malloc.h)."""


def limit_driver_arenas(env: Mapping[str, str] = os.environ) -> bool:
    """Apply :data:`WORKER_ENV`'s glibc limits to this process, unless its environment sets them
    (glibc read those at start-up, and they win). False where there is no glibc (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    applied = True
    for param, name in ((_M_ARENA_MAX, "MALLOC_ARENA_MAX"), (_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_")):
        if name not in env:
            applied &= mallopt(param, int(WORKER_ENV[name])) == 1
    if not applied:
        log.warning("glibc refused the driver's allocator limits; the driver may keep freed memory")
    return applied


def app_conf(configured: Mapping[str, str], command_line: Mapping[str, str]) -> dict[str, str]:
    """The app session's Spark properties: these defaults, then the YAML's ``spark.conf``
    (``configured``), then ``--conf`` (``command_line``); the later wins."""
    return {
        "spark.driver.memory": DRIVER_MEMORY,
        **{f"spark.executorEnv.{name}": value for name, value in WORKER_ENV.items()},
        **configured,
        **command_line,
    }
