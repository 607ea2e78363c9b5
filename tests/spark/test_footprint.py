"""The app's memory defaults (issue 26, item 1): a planning-sized driver JVM and the workers'
allocators as Spark properties, each overridden by the YAML's ``spark.conf`` and then by ``--conf``;
the serial collector left out when the user's Java options choose a collector (the JVM refuses two).
The JVM starting with them is checked in test_jvm.py; their effect on memory is a benchmark
(docs/benchmarks/memory.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fanout_sink.config.loading import parse_config
from fanout_sink.spark import footprint, jvm


def test_defaults_then_the_yaml_then_the_command_line() -> None:
    config = parse_config(
        {
            "name": "s",
            "source": {"topics": ["t"]},
            "tables": {"db.t": {}},
            "spark": {"conf": {"spark.driver.memory": "1g", "spark.executorEnv.MALLOC_ARENA_MAX": "4"}},
        },
        "sink.yaml",
    )
    conf = footprint.app_conf(config.spark.conf, {"spark.executorEnv.MALLOC_ARENA_MAX": "8"})
    assert conf["spark.driver.memory"] == "1g"
    assert conf["spark.executorEnv.MALLOC_ARENA_MAX"] == "8"
    assert conf["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    defaults = footprint.app_conf({}, {})
    assert defaults["spark.driver.memory"] == footprint.DRIVER_MEMORY
    assert {k.removeprefix("spark.executorEnv.") for k in defaults if "executorEnv" in k} == set(
        footprint.WORKER_ENV
    )


def test_the_apps_jvm_gets_the_serial_collector_unless_the_user_chooses_one() -> None:
    no_archive = jvm.DriverJvm(None, False)
    app = jvm.driver_java_options(no_archive, True, "-Dx=1").split()
    assert app == [jvm.LIGHT_JIT, jvm.PLANNING_GC, *jvm.PLANNING_OPTIONS, "-Dx=1"]
    chosen = jvm.driver_java_options(no_archive, True, "-XX:+UseG1GC -XX:ReservedCodeCacheSize=128m")
    assert jvm.PLANNING_GC not in chosen
    assert chosen.endswith("-XX:+UseG1GC -XX:ReservedCodeCacheSize=128m"), "the user's flags come last"
    assert jvm.driver_java_options(no_archive, False, None) == "", (
        "sessions that run queries keep the JVM's own"
    )


_ARENAS = """
import ctypes, sys, tempfile, threading
from fanout_sink.spark import footprint
if sys.argv[1] == "limit":
    assert footprint.limit_driver_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.fopen.restype = ctypes.c_void_p
barrier = threading.Barrier(8)
def first_malloc():  # glibc gives a thread its arena at its first malloc
    barrier.wait()
    libc.malloc(64)
threads = [threading.Thread(target=first_malloc) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with tempfile.NamedTemporaryFile() as report:
    stream = ctypes.c_void_p(libc.fopen(report.name.encode(), b"w"))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(report.name).read().count("<heap nr="))
"""


def _arenas(mode: str, **env: str) -> int:
    """glibc's arenas in a fresh interpreter after 8 threads' first allocations (malloc_info)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS, mode], env=environ, capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_driver_python_keeps_to_two_arenas_unless_its_environment_says_otherwise() -> None:
    assert _arenas("none") > 4, "without the limit every new thread takes an arena of its own"
    assert _arenas("limit") == 2
    assert 2 < _arenas("limit", MALLOC_ARENA_MAX="4") <= 4, "the user's environment wins"
