"""A Spark standalone cluster on 127.0.0.1: one master and N workers, each its own JVM, from PySpark's jars.

The pip ``pyspark`` package is a full Spark distribution (``jars/``, ``python/lib/pyspark.zip``), so the
master and workers run straight from it, as ``java -cp "$SPARK_HOME/jars/*" ...deploy.master.Master``
and ``...deploy.worker.Worker``: no download, and the cluster runs exactly the Spark the driver links.
Executors are then real remote processes (``CoarseGrainedExecutorBackend`` JVMs forked by a worker),
which is what the cluster tests kill. Readiness is the master's JSON page listing ALIVE workers.

Two settings a distribution's ``spark-class`` script would export are given to the workers here:
``SPARK_HOME`` (an executor's classpath and ``pyspark.zip`` are found through it) and
``SPARK_SCALA_VERSION`` (without it, the launcher that builds an executor's command looks for a source
build and fails with "Cannot find any build directories").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import free_port, log_tail, stop_pid
from fanout_sink.errors import StackError
from fanout_sink.processes import pid_alive

_STATE_FILE = "spark-cluster.json"
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_DAEMON_HEAP = "256m"


def spark_home() -> Path:
    """The pip ``pyspark`` package folder, which is a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _scala_version(home: Path) -> str:
    """``2.13`` from ``scala-library-2.13.x.jar``, as Spark's own scripts derive it."""
    for jar in (home / "jars").glob("scala-library-*.jar"):
        return ".".join(jar.stem.removeprefix("scala-library-").split(".")[:2])
    raise StackError(f"no scala-library jar in {home / 'jars'}", "reinstall pyspark (`pip install pyspark`)")


def daemon_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a master or worker JVM (and so of the executors a worker starts).

    ``PYTHONPATH`` is dropped: an executor must import the packed environment's ``fanout_sink``, not
    a checkout that happens to be on the machine that started the worker.
    """
    home = spark_home()
    env = {k: v for k, v in (base or dict(os.environ)).items() if k != "PYTHONPATH"}
    # Everything of the dev stack listens on loopback: without this, Spark binds its services and the
    # executors' block managers to the host's first non-loopback address.
    env.update(SPARK_HOME=str(home), SPARK_SCALA_VERSION=_scala_version(home), SPARK_LOCAL_IP="127.0.0.1")
    return env


def master_command(port: int, webui_port: int) -> list[str]:
    """The master in the foreground (what ``fanout-sink stack serve spark-master`` and docker/ run)."""
    return [
        *_jvm(),
        _MASTER_CLASS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        str(webui_port),
    ]


def worker_command(master_url: str, work_dir: Path, cores: int, memory: str, webui_port: int) -> list[str]:
    """One worker in the foreground; ``work_dir`` holds its executors' folders and logs."""
    return [
        *_jvm(), _WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
        "--work-dir", str(work_dir), "--webui-port", str(webui_port), master_url,
    ]  # fmt: skip


def _jvm() -> list[str]:
    java = jars.require_tool(
        "java", "install a JDK 17 (Debian: `apt-get install -y openjdk-17-jdk-headless`)"
    )
    return [java, f"-Xmx{_DAEMON_HEAP}", "-cp", str(spark_home() / "jars" / "*")]


@dataclass(frozen=True)
class SparkClusterState:
    """What a started cluster leaves on disk: where the master listens and which JVMs make it up."""

    master_pid: int
    port: int
    webui_port: int
    worker_pids: tuple[int, ...]
    work_dir: str

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"


def master_status(webui_port: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """The master's own JSON view (workers with their state, applications, cores)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=timeout_s) as response:
        status: dict[str, Any] = json.loads(response.read())
    return status


class SparkCluster:
    """A master and ``workers`` workers under ``work_dir`` (logs, state, each worker's executor folders)."""

    def __init__(self, work_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1536m") -> None:
        self.work_dir = work_dir.resolve()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes] | None] = [None] * workers
        self.state: SparkClusterState | None = None

    @property
    def master_url(self) -> str:
        if self.state is None:
            raise StackError("the Spark cluster is not started", "call start() first")
        return self.state.master_url

    def _spawn(
        self, command: list[str], log_name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.work_dir / log_name).open("ab") as log:
            return subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.work_dir, env={**daemon_env(), **(env or {})},
            )  # fmt: skip

    def _worker_dir(self, index: int) -> Path:
        return self.work_dir / f"worker-{index}"

    def start(self, timeout_s: float = 120.0) -> SparkClusterState:
        """Start the master, then the workers; return once every worker is ALIVE at the master."""
        existing = load_state(self.work_dir)
        if existing is not None and pid_alive(existing.master_pid):
            raise StackError(
                f"a Spark master from {self.work_dir} is already running (pid {existing.master_pid}, "
                f"{existing.master_url})",
                "use it, or stop it first (kill the pids in spark-cluster.json)",
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        webui_port = free_port()
        self._master = self._spawn(master_command(port, webui_port), "master.log")
        self.state = SparkClusterState(self._master.pid, port, webui_port, (), str(self.work_dir))
        self._wait(lambda status: True, timeout_s, "the Spark master did not answer", "master.log")
        for index in range(self.workers):
            self._start_worker(index)
        self._wait_workers(timeout_s)
        return self.state

    def _start_worker(self, index: int) -> None:
        assert self.state is not None
        folder = self._worker_dir(index)
        folder.mkdir(parents=True, exist_ok=True)
        command = worker_command(self.state.master_url, folder, self.cores, self.memory, free_port())
        # The executors' scratch space (shuffle, spills, fetched files) stays in the worker's folder.
        local = {"SPARK_LOCAL_DIRS": str(folder / "local")}
        self._workers[index] = self._spawn(command, f"worker-{index}.log", local)
        pids = tuple(p.pid if p is not None else 0 for p in self._workers)
        self.state = SparkClusterState(
            self.state.master_pid, self.state.port, self.state.webui_port, pids, self.state.work_dir
        )
        (self.work_dir / _STATE_FILE).write_text(json.dumps(asdict(self.state), indent=2) + "\n")

    def alive_workers(self) -> int:
        assert self.state is not None
        try:
            status = master_status(self.state.webui_port)
        except OSError:
            return 0
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def _wait_workers(self, timeout_s: float) -> None:
        wanted = sum(1 for p in self._workers if p is not None)
        self._wait(
            lambda status: sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE") >= wanted,
            timeout_s,
            f"not all {wanted} Spark worker(s) registered with the master as ALIVE",
            "worker-0.log",
        )

    def _wait(self, ready: Any, timeout_s: float, what: str, log_name: str) -> None:
        assert self.state is not None and self._master is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._master.poll() is not None:
                log_name = "master.log"
                break
            dead = [i for i, p in enumerate(self._workers) if p is not None and p.poll() is not None]
            if dead:
                log_name = f"worker-{dead[0]}.log"
                break
            with contextlib.suppress(OSError, ValueError):
                if ready(master_status(self.state.webui_port, timeout_s=2)):
                    return
            time.sleep(0.3)
        log = self.work_dir / log_name
        self.kill()
        raise StackError(
            f"{what} within {timeout_s:.0f}s (or a JVM exited)",
            "read the log below for the Java error; the machine may be short of memory",
            f"last lines of {log}:\n{log_tail(log)}",
        )

    def kill_worker(self, index: int) -> int:
        """SIGKILL a worker JVM, as a lost machine; its executors die with it (they watch the worker)."""
        process = self._workers[index]
        assert process is not None, f"worker {index} is not running"
        executors = self.executor_pids(index)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        for pid in executors:  # an orphaned executor exits on its own; do not leave it to chance
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._workers[index] = None
        return process.pid

    def restart_worker(self, index: int, timeout_s: float = 120.0) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait until it is ALIVE."""
        assert self._workers[index] is None, f"worker {index} still runs"
        self._start_worker(index)
        self._wait_workers(timeout_s)

    def revive(self, timeout_s: float = 120.0) -> None:
        """Start every worker that is not running (killed, or died) and wait until all are ALIVE."""
        for index, process in enumerate(self._workers):
            if process is None or process.poll() is not None:
                self._workers[index] = None
                self._start_worker(index)
        self._wait_workers(timeout_s)

    def executor_pids(self, index: int | None = None) -> list[int]:
        """The executor JVMs (``CoarseGrainedExecutorBackend``) of one worker, or of all."""
        indexes = range(self.workers) if index is None else [index]
        found: list[int] = []
        for i in indexes:
            process = self._workers[i]
            if process is None:
                continue
            found.extend(p for p in children(process.pid) if _EXECUTOR_CLASS in cmdline(p))
        return found

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every JVM (workers first, they take their executors along), SIGKILL the stragglers."""
        for index, process in enumerate(self._workers):
            if process is not None:
                executors = self.executor_pids(index)
                stop_pid(process.pid, timeout_s)
                process.wait(5)
                for pid in executors:
                    stop_pid(pid, 5)
                self._workers[index] = None
        if self._master is not None:
            stop_pid(self._master.pid, timeout_s)
            self._master.wait(5)
            self._master = None

    def kill(self) -> None:
        """SIGKILL everything this object started."""
        for index, process in enumerate(self._workers):
            if process is not None:
                self.kill_worker(index)
        if self._master is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._master.pid, signal.SIGKILL)
            self._master.wait(30)
            self._master = None


def load_state(work_dir: Path) -> SparkClusterState | None:
    try:
        raw = json.loads((work_dir / _STATE_FILE).read_text())
        raw["worker_pids"] = tuple(raw["worker_pids"])
        return SparkClusterState(**raw)
    except (OSError, ValueError, TypeError, KeyError):
        return None


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
