"""A Spark standalone cluster on 127.0.0.1: one master and N workers, each its own JVM, from PySpark's jars.

The pip ``pyspark`` package is a full Spark distribution (``jars/``, ``python/lib/pyspark.zip``), so the
master and workers run straight from it, as ``java -cp "$SPARK_HOME/jars/*" ...deploy.master.Master``
and ``...deploy.worker.Worker``: no download, and the cluster runs exactly the Spark the driver links.
Executors are then real remote processes (``CoarseGrainedExecutorBackend`` JVMs forked by a worker),
which is what the cluster tests kill. The master is ready when its JSON page answers, a worker when
the master lists it ALIVE.

The master and a worker are stack servers like the others (``fanout-sink stack serve spark-master``,
``... spark-worker``, which docker/ runs); :class:`SparkCluster` is a master and N workers for tests.

Two settings a distribution's ``spark-class`` script would export are given to the JVMs here:
``SPARK_HOME`` (an executor's classpath and ``pyspark.zip`` are found through it) and
``SPARK_SCALA_VERSION`` (without it, the launcher that builds an executor's command looks for a source
build and fails with "Cannot find any build directories").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fanout_sink.devtools.stack.service import LOCALHOST, LocalServer, java, pick_port
from fanout_sink.errors import StackError

_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_DAEMON_HEAP = "256m"
MASTER_ENV = "FANOUT_SINK_SPARK_MASTER"
"""The master a ``spark-worker`` joins when no master runs in its stack folder (docker: another container)."""


def spark_home() -> Path:
    """The pip ``pyspark`` package folder, which is a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _scala_version(home: Path) -> str:
    """``2.13`` from ``scala-library-2.13.x.jar``, as Spark's own scripts derive it."""
    for jar in (home / "jars").glob("scala-library-*.jar"):
        return ".".join(jar.stem.removeprefix("scala-library-").split(".")[:2])
    raise StackError(f"no scala-library jar in {home / 'jars'}", "reinstall pyspark (`pip install pyspark`)")


def daemon_env(host: str = LOCALHOST) -> dict[str, str]:
    """The environment of a master or worker JVM (and so of the executors a worker starts).

    ``PYTHONPATH`` is dropped: an executor must import the packed environment's ``fanout_sink``, not
    a checkout that happens to be on the machine that started the worker. ``SPARK_LOCAL_IP`` keeps
    Spark's services (an executor's block manager too) on the stack's address instead of the host's
    first non-loopback one.
    """
    home = spark_home()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_HOME=str(home), SPARK_SCALA_VERSION=_scala_version(home), SPARK_LOCAL_IP=host)
    return env


def _jvm() -> list[str]:
    return [java(), f"-Xmx{_DAEMON_HEAP}", "-cp", str(spark_home() / "jars" / "*")]


def master_status(webui_port: int, timeout_s: float = 5.0, host: str = LOCALHOST) -> dict[str, Any]:
    """The master's own JSON view (workers with their state, applications, cores)."""
    with urllib.request.urlopen(f"http://{host}:{webui_port}/json/", timeout=timeout_s) as response:
        status: dict[str, Any] = json.loads(response.read())
    return status


def alive_workers(webui_port: int) -> list[str]:
    """``host:port`` of every worker the master lists ALIVE (none when the master does not answer)."""
    try:
        workers = master_status(webui_port, timeout_s=2).get("workers", [])
    except (OSError, ValueError):
        return []
    return [f"{w['host']}:{w['port']}" for w in workers if w.get("state") == "ALIVE"]


@dataclass(frozen=True)
class SparkMasterState:
    pid: int
    port: int
    webui_port: int
    log_file: str

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"


class SparkMaster(LocalServer[SparkMasterState]):
    """The standalone master: ``port`` for workers and drivers, a web UI port for its JSON status."""

    kind = "spark-master"
    title = "Spark master"
    state_type = SparkMasterState

    def _launch(self, previous: SparkMasterState | None) -> SparkMasterState:
        port = pick_port(self.requested_port, previous.port if previous else None)
        webui = pick_port(None, previous.webui_port if previous else None, taken=(port,))
        command = [
            *_jvm(),
            _MASTER_CLASS,
            "--host",
            self.host,
            "--port",
            str(port),
            "--webui-port",
            str(webui),
        ]
        pid = self._spawn(command, daemon_env(self.host))
        return SparkMasterState(pid, port, webui, str(self.log_file))

    def _ready(self, state: SparkMasterState) -> bool:
        with contextlib.suppress(OSError, ValueError):
            # Spark binds its web UI where SPARK_LOCAL_IP says: the master's host (in a container its
            # service name), every address for 0.0.0.0.
            host = LOCALHOST if self.host == "0.0.0.0" else self.host
            return master_status(state.webui_port, timeout_s=2, host=host).get("status") == "ALIVE"
        return False


@dataclass(frozen=True)
class SparkWorkerState:
    pid: int
    port: int
    webui_port: int
    master_url: str
    log_file: str


class SparkWorker(LocalServer[SparkWorkerState]):
    """One worker of ``master_url`` with ``cores`` and ``memory`` to offer; its executors' folders and
    scratch space live in its work dir."""

    kind = "spark-worker"
    title = "Spark worker"
    state_type = SparkWorkerState
    _REGISTERED = b"Successfully registered with master"

    def __init__(
        self,
        work_dir: Path,
        master_url: str,
        port: int | None = None,
        host: str = LOCALHOST,
        cores: int = 1,
        memory: str = "1536m",
    ) -> None:
        super().__init__(work_dir, port, host)
        self.master_url = master_url
        self.cores = cores
        self.memory = memory
        self._log_offset = 0

    def _launch(self, previous: SparkWorkerState | None) -> SparkWorkerState:
        port = pick_port(self.requested_port, previous.port if previous else None)
        webui = pick_port(None, previous.webui_port if previous else None, taken=(port,))
        command = [
            *_jvm(), _WORKER_CLASS, "--host", self.host, "--port", str(port), "--webui-port", str(webui),
            "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(self.work_dir / "executors"), self.master_url,
        ]  # fmt: skip
        env = {**daemon_env(self.host), "SPARK_LOCAL_DIRS": str(self.work_dir / "local")}
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        pid = self._spawn(command, env)
        return SparkWorkerState(pid, port, webui, self.master_url, str(self.log_file))

    def _ready(self, state: SparkWorkerState) -> bool:
        """Registered with its master in this start (the log of earlier starts does not count)."""
        try:
            with open(state.log_file, "rb") as log:
                log.seek(self._log_offset)
                return self._REGISTERED in log.read()
        except OSError:
            return False

    def executor_pids(self) -> list[int]:
        """The executor JVMs (``CoarseGrainedExecutorBackend``) this worker forked."""
        if self.state is None:
            return []
        return [pid for pid in children(self.state.pid) if _EXECUTOR_CLASS in cmdline(pid)]

    def kill(self) -> None:
        """SIGKILL, as a lost machine; its executors go too (an orphan would exit on its own, later)."""
        executors = self.executor_pids()
        super().kill()
        for pid in executors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def master_url_for(stack_dir: Path) -> str:
    """The master a worker of this stack folder joins: the folder's running master, else ``$MASTER_ENV``."""
    state = SparkMaster(stack_dir / "spark-master").running()
    if state is not None:
        return state.master_url
    url = os.environ.get(MASTER_ENV)
    if not url:
        raise StackError(
            "a Spark worker needs a master and none runs in this stack folder",
            f"start one first (`fanout-sink stack up --with spark-master,spark-worker`), or set {MASTER_ENV}"
            "=spark://host:7077",
        )
    return url


class SparkCluster:
    """A master and ``workers`` workers under ``work_dir`` (each in its own folder), for tests."""

    def __init__(self, work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1536m") -> None:
        self.work_dir = work_dir.resolve()
        self.master = SparkMaster(self.work_dir / "master")
        self._shape = (cores, memory)
        self.workers: list[SparkWorker] = []
        self._count = workers

    @property
    def master_state(self) -> SparkMasterState:
        if self.master.state is None:
            raise StackError("the Spark cluster is not started", "call start() first")
        return self.master.state

    @property
    def master_url(self) -> str:
        return self.master_state.master_url

    def start(self, timeout_s: float = 120.0) -> SparkMasterState:
        """The master, then every worker; returns once the master lists them all ALIVE."""
        state = self.master.start(timeout_s)
        cores, memory = self._shape
        self.workers = [
            SparkWorker(self.work_dir / f"worker-{i}", state.master_url, cores=cores, memory=memory)
            for i in range(self._count)
        ]
        _start_all(self.workers, timeout_s)
        self._wait_alive(timeout_s)
        return state

    def alive_workers(self) -> int:
        return len(alive_workers(self.master_state.webui_port))

    def _wait_alive(self, timeout_s: float) -> None:
        wanted = sum(1 for w in self.workers if w.state is not None)
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() != wanted:
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Spark master lists {self.alive_workers()} ALIVE workers, not {wanted}, "
                    f"after {timeout_s:.0f}s",
                    f"read the master's log {self.master.log_file}",
                )
            time.sleep(0.3)

    def kill_worker(self, index: int) -> int:
        """SIGKILL worker ``index`` and its executors, as a lost machine; the worker's pid."""
        worker = self.workers[index]
        assert worker.state is not None, f"worker {index} is not running"
        pid = worker.state.pid
        worker.kill()
        worker.state = None
        self._wait_alive(60)  # the master drops it once the connection closes
        return pid

    def revive(self, timeout_s: float = 120.0) -> None:
        """Start every worker that does not run (killed, or died) again, in its folder and on its port."""
        down = [worker for worker in self.workers if worker.running() is None]
        for worker in down:
            worker.state = None
        _start_all(down, timeout_s)
        self._wait_alive(timeout_s)

    def executor_pids(self) -> list[int]:
        return [pid for worker in self.workers for pid in worker.executor_pids()]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.master.kill()


def _start_all(workers: list[SparkWorker], timeout_s: float) -> None:
    """Start the workers side by side: each is a JVM start and a registration with the master, and
    one after the other they cost a cluster's start-up once per worker. A failure is raised here."""
    with ThreadPoolExecutor(max_workers=max(len(workers), 1), thread_name_prefix="spark-worker") as pool:
        for started in [pool.submit(worker.start, timeout_s) for worker in workers]:
            started.result()


def children(pid: int) -> list[int]:
    """Every thread's children: a JVM forks processes from threads other than its main one."""
    found: list[int] = []
    for listed in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(child) for child in listed.read_text().split())
    return found


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
