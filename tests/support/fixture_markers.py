"""The suite's tier markers come from the fixtures a test takes, and a guard keeps them true.

A test that takes ``kafka_broker`` (or anything built on it: ``bootstrap_servers``, ``make_topic``) is a
``kafka`` test without anyone writing ``@pytest.mark.kafka``; likewise ``spark``, ``stores`` and
``cluster``. ``item.fixturenames`` is the test's whole fixture closure, so the derivation is transitive.
A test that starts such a thing itself (the app in a child, ``fanout-sink stack up``) says so by taking
a declaring fixture: ``own_broker``, ``own_spark``, ``own_stores``, ``own_cluster``. ``chaos`` stays a
hand-written marker: a chaos run starts everything it breaks.

Two checks keep a marker from being wrong, which matters because the tiers select by marker
(``python3 -m fanout_sink.bootstrap test --tier fast|middle``):

- collection fails when a hand-written tier marker is not implied by the test's fixtures;
- while a test runs, starting a broker, a Spark driver, a storage server or a cluster that its markers
  do not allow fails with the fixture to take: a command the test's thread starts is read before it
  runs (``KafkaBroker.start``'s and the stack launchers' ``java``, PySpark's ``spark-submit``,
  PostgreSQL's programs), and its children find first on PATH a ``java`` that refuses the Kafka,
  Spark and storage servers' main classes and runs every other command.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from fanout_sink.spark.jvm import java_home

FIXTURE_MARKERS: dict[str, str] = {
    "kafka_broker": "kafka",
    "broker_factory": "kafka",
    "expiring_broker": "kafka",
    "expired": "kafka",
    "tls_broker": "kafka",
    "own_broker": "kafka",
    "sink_factory": "kafka",  # its sinks' topics are on a broker (the shared one unless told otherwise)
    "spark": "spark",
    "own_spark": "own_spark",
    "object_store_process": "stores",
    "rest_catalog_process": "stores",
    "postgres_process": "stores",
    "own_stores": "stores",
    "spark_cluster": "cluster",
    "executor_pack": "cluster",
    "own_cluster": "cluster",
}
"""Fixture -> the marker every test whose fixture closure holds it gets."""

DERIVED = frozenset(FIXTURE_MARKERS.values())
ALL_ALLOWED = "chaos"
"""A chaos run starts the broker, the app and the catalog it breaks: its marker allows every launch."""


def _takers(*markers: str) -> str:
    return " or ".join(f"`{name}`" for name, derived in FIXTURE_MARKERS.items() if derived in markers)


_LAUNCHES: dict[str, tuple[frozenset[str], str]] = {
    "a Kafka broker": (frozenset({"kafka"}), _takers("kafka")),
    "a Spark driver": (
        frozenset({"spark", "own_spark", "cluster"}),
        "`spark` (the shared session) or `own_spark`",
    ),
    "a storage server": (frozenset({"stores"}), _takers("stores")),
    "a Spark cluster": (frozenset({"cluster"}), _takers("cluster")),
}
"""What a test may start -> (the markers that allow it, the fixtures to take)."""

_JAVA_MAIN_CLASSES = {
    "a Kafka broker": ("kafka.Kafka", "kafka.tools.StorageTool"),
    "a Spark driver": ("org.apache.spark.deploy.SparkSubmit",),
    "a storage server": ("s3proxy", "RestCatalogLauncher", "HiveMetaStore", "MetastoreSchemaTool"),
    "a Spark cluster": ("org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"),
}
"""Words of a ``java`` command line that start each kind of server."""


def _refusal(what: str) -> str:
    return f"this test starts {what} without declaring it: take the fixture {_LAUNCHES[what][1]}"


def _hand_written_errors(item: pytest.Item, derived: set[str]) -> list[str]:
    wrong = sorted({mark.name for mark in item.iter_markers() if mark.name in DERIVED} - derived)
    return [
        f"{item.nodeid}: marked `{name}` by hand, but none of its fixtures implies it: take "
        f"{_takers(name, 'own_spark') if name == 'spark' else _takers(name)}, or remove the marker"
        for name in wrong
    ]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Add the derived markers before ``-m`` selects (hence ``tryfirst``); refuse wrong hand-written ones."""
    errors: list[str] = []
    for item in items:
        derived = {
            FIXTURE_MARKERS[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURE_MARKERS
        }
        errors += _hand_written_errors(item, derived)
        for name in sorted(derived):
            item.add_marker(name)
    if errors:
        raise pytest.UsageError("tier markers come from fixtures:\n" + "\n".join(errors))


@pytest.fixture(scope="session")
def own_broker() -> None:
    """Declares that the test starts Kafka brokers itself (``fanout-sink stack up`` in a child)."""


@pytest.fixture(scope="session")
def own_spark() -> None:
    """Declares that the test starts a Spark driver of its own, here or in a child (the app, the demo,
    a Spark script): marked ``own_spark``, which the middle tier leaves out."""


@pytest.fixture(scope="session")
def own_cluster() -> None:
    """Declares that the test starts a Spark master and workers itself (``fanout-sink stack serve``)."""


@pytest.fixture(scope="session")
def own_stores() -> None:
    """Declares that the test starts the storage servers itself (``fanout-sink stack up`` in a child)."""


_SHIMS: dict[frozenset[str], Path] = {}
_JAVA_HOME = "FANOUT_SINK_TEST_JAVA_HOME"
"""The child's own ``JAVA_HOME`` while the shim stands in for it."""


def _java_shim(tmp_path_factory: pytest.TempPathFactory, refused: frozenset[str]) -> Path:
    """A JDK home whose ``bin/java`` refuses the command lines that start what ``refused`` names and
    runs, for everything else (``java -version``, Maven, a test's own small JVM), the ``java`` the child
    would have run without it: its ``JAVA_HOME``'s, else the next one on its PATH (none, if none)."""
    if refused not in _SHIMS:
        folder = tmp_path_factory.mktemp("java-guard")
        java = folder / "bin" / "java"
        cases = "".join(
            f"    *{shlex.quote(word)}*) echo {shlex.quote(_refusal(what))} >&2; exit 97;;\n"
            for what in sorted(refused)
            for word in _JAVA_MAIN_CLASSES[what]
        )
        java.parent.mkdir()
        java.write_text(
            f'#!/bin/sh\ncase "$*" in\n{cases}esac\n'
            f'PATH="${{PATH#{java.parent}:}}"; export PATH\n'
            f'if [ -n "${{{_JAVA_HOME}:-}}" ]; then\n'
            f'    JAVA_HOME="${_JAVA_HOME}"; export JAVA_HOME; exec "$JAVA_HOME/bin/java" "$@"\n'
            f"fi\n"
            f'exec java "$@"\n'
        )
        java.chmod(0o755)
        # The JDK's own lib beside the shim: the driver's class archive is keyed by the libjvm under
        # the home `java` is found in, resolved (fanout_sink.spark.jvm.archive_path). Without it every
        # session's guard folder keyed archives of its own: each Spark JVM under the guard dumped one
        # at exit (minutes of a loaded run) and pushed the suite's real archives out of the cache.
        real = java_home()  # the JDK a child would run without the shim
        if real is not None and (real / "lib").is_dir():
            (folder / "lib").symlink_to(real / "lib", target_is_directory=True)
        _SHIMS[refused] = folder
    return _SHIMS[refused]


def _starts(command: Any) -> str | None:
    """What a command line starts, of the things only a declaring fixture allows, if anything."""
    argv = [str(word) for word in command] if isinstance(command, (list, tuple)) else str(command).split()
    names = {Path(word).name for word in argv}
    line = " ".join(argv)
    if "java" in names:
        return next(
            (what for what, words in _JAVA_MAIN_CLASSES.items() if any(w in line for w in words)), None
        )
    if "spark-submit" in names:
        return "a Spark driver"
    return "a storage server" if names & {"initdb", "postgres"} else None


def _guard_children(monkeypatch: pytest.MonkeyPatch, refused: frozenset[str], home: Path) -> None:
    """Commands the test's own thread starts are refused when they start what ``refused`` names;
    their children find the shim first on PATH (and as JAVA_HOME, when set). The session's background
    threads (the expiry arrangement) start what they need."""
    original = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if len(args) <= 1 and threading.current_thread() is threading.main_thread():
            what = _starts(args[0] if args else kwargs.get("args", ()))
            if what in refused:
                raise pytest.fail.Exception(_refusal(what))
            given = kwargs.get("env")
            env = dict(os.environ if given is None else given)
            env["PATH"] = f"{home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
            if env.get("JAVA_HOME"):
                env[_JAVA_HOME], env["JAVA_HOME"] = env["JAVA_HOME"], str(home)
            kwargs["env"] = env
        original(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)


@pytest.fixture(autouse=True)
def _launch_guard(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    markers = {mark.name for mark in request.node.iter_markers()}
    if ALL_ALLOWED in markers:
        return
    refused = frozenset(what for what, (allow, _) in _LAUNCHES.items() if not allow & markers)
    if refused:
        _guard_children(monkeypatch, refused, _java_shim(tmp_path_factory, refused))
