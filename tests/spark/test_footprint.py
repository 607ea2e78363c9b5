"""The app's memory defaults (issue 26, item 1): a planning-sized driver JVM and the workers'
allocators as Spark properties, each overridden by the YAML's ``spark.conf`` and then by ``--conf``;
the serial collector left out when the user's Java options choose a collector (the JVM refuses two).
The JVM starting with them is checked in test_jvm.py; their effect on memory is a benchmark
(docs/benchmarks/memory.md)."""

from __future__ import annotations

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
