"""What every developer-stack server besides the broker shares: one process per work dir, its state as
JSON beside its log, start that waits until clients are served, stop (SIGTERM) and kill (SIGKILL).

A server's state is what another process needs to find, use or stop it, so ``fanout-sink stack``,
the test fixtures and docker's foreground ``serve`` all read the same file.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import free_port, log_tail, port_is_free, stop_pid
from fanout_sink.errors import StackError
from fanout_sink.processes import pid_alive

LOCALHOST = "127.0.0.1"
JAVA_MIN = 17
"""Every server of the stack runs on Java 17+ (Spark 4.1's and Kafka 4's floor)."""


class ServerState(Protocol):
    """The fields every server's frozen state dataclass has."""

    @property
    def pid(self) -> int: ...

    @property
    def port(self) -> int: ...

    @property
    def log_file(self) -> str: ...


S = TypeVar("S", bound=ServerState)


@dataclass(frozen=True)
class CatalogServerState:
    """What a catalog server of the stack (REST, Hive Metastore) saves: where it serves, the JDBC URL or
    folder of its own state (no secret in it) and the store folder its tables live under."""

    pid: int
    port: int
    log_file: str
    warehouse_location: str
    database: str


def pick_port(requested: int | None, previous: int | None, taken: Sequence[int] = ()) -> int:
    """``requested`` (must be free), else the port of the previous run (clients keep their URLs across
    a restart) when free, else any free port; never one of ``taken``."""
    if requested is not None:
        if not port_is_free(requested) or requested in taken:
            raise StackError(
                f"port {requested} on 127.0.0.1 is already taken",
                f"stop the process holding it (`ss -ltnp 'sport = :{requested}'`) or choose another port",
            )
        return requested
    port = previous
    while port is None or port in taken or not port_is_free(port):
        port = free_port()
    return port


def java() -> str:
    """A ``java`` of at least version ``JAVA_MIN``: the one on PATH, else ``$JAVA_HOME``'s, else the
    newest under /usr/lib/jvm."""
    candidates = [
        shutil.which("java"),
        os.path.join(os.environ.get("JAVA_HOME", "/nonexistent"), "bin", "java"),
    ]
    candidates += sorted(glob.glob("/usr/lib/jvm/*/bin/java"), key=java_major, reverse=True)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and java_major(candidate) >= JAVA_MIN:
            return candidate
    raise StackError(
        f"no Java {JAVA_MIN}+ runtime was found (on PATH, in $JAVA_HOME or under /usr/lib/jvm)",
        f"install a JDK {JAVA_MIN} or newer and put its `java` first on PATH or in JAVA_HOME",
    )


@functools.cache
def java_major(path: str) -> int:
    """The feature version of the ``java`` at ``path`` (8 for 1.8), 0 when it does not run."""
    try:
        out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    match = re.search(r'version "(?:1\.)?(\d+)', out.stderr)
    return int(match.group(1)) if match else 0


def single_jar(jar_set: jars.JarSet) -> Path:
    """The one jar of a set that holds a self-contained server (fetched on first use)."""
    paths = jars.jars(jar_set)
    if len(paths) != 1:
        raise StackError(
            f"expected one self-contained jar in the {jar_set.name} set, found {[p.name for p in paths]}",
            f"delete {jars.jar_dir(jar_set)} and retry (it is fetched again)",
        )
    return paths[0]


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """The HTTP status ``url`` answers with, or None when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


class LocalServer(Generic[S]):
    """One server process whose config, data, state (``<kind>.json``) and log (``<kind>.log``) live
    under ``work_dir``. Subclasses say how to launch it (``_launch``) and when it serves (``_ready``).
    """

    kind: ClassVar[str]
    """Short name: the state and log file names and ``fanout-sink stack serve <kind>``."""
    title: ClassVar[str]
    """What people call it, for messages."""
    state_type: ClassVar[type[Any]]
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    """What asks the server to shut down cleanly."""

    def __init__(self, work_dir: Path, port: int | None = None, host: str = LOCALHOST) -> None:
        """``host`` is the address to listen on: 127.0.0.1 but in containers (``0.0.0.0``)."""
        self.work_dir = work_dir.resolve()
        self.requested_port = port
        self.host = host
        self.state: S | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        """How the process this object started last exited (set by stop and kill)."""

    @property
    def log_file(self) -> Path:
        return self.work_dir / f"{self.kind}.log"

    @property
    def state_file(self) -> Path:
        return self.work_dir / f"{self.kind}.json"

    def load_state(self) -> S | None:
        try:
            state: S = self.state_type(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return state

    def running(self) -> S | None:
        """The state of a server from this work dir that is up and serving, else None."""
        state = self.load_state()
        if state is None or not pid_alive(state.pid) or not self._ready(state):
            return None
        return state

    def start(self, timeout_s: float = 120.0) -> S:
        """Start the server and return once it serves clients; StackError within ``timeout_s``.

        A restart in the same work dir keeps its data, port and credentials."""
        previous = self.load_state()
        if previous is not None and pid_alive(previous.pid):
            raise StackError(
                f"{self.title} from {self.work_dir} is already running (pid {previous.pid}, "
                f"port {previous.port})",
                "use it, or stop it first (`fanout-sink stack down`)",
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self.state = self._launch(previous)
        self._wait_ready(log_offset, timeout_s)
        self.state_file.write_text(json.dumps(asdict(self.state), indent=2) + "\n")  # type: ignore[call-overload]
        self.state_file.chmod(0o600)  # it holds the server's credentials
        return self.state

    def _launch(self, previous: S | None) -> S:
        """Write the config, spawn the process (``_spawn``) and return its state."""
        raise NotImplementedError

    def _ready(self, state: S) -> bool:
        """The server answers clients."""
        raise NotImplementedError

    def _diagnose(self, tail: str) -> tuple[str, str]:
        """(cause, fix) for a process that exited during start-up, from its log's last lines."""
        if "Address already in use" in tail or "BindException" in tail:
            return (f"the {self.title} could not bind its port: it is taken", "start it on a free port")
        if "UnsupportedClassVersionError" in tail:
            return (f"the JVM on PATH is too old for the {self.title}", "put a Java 17+ `java` first on PATH")
        return (f"the {self.title} exited during start-up", "read its log (last lines below)")

    def _spawn(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        """Start ``command`` in its own session with stdout and stderr appended to the log; its pid."""
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.work_dir, env=None if env is None else dict(env),
            )  # fmt: skip
        return self._process.pid

    def _wait_ready(self, log_offset: int, timeout_s: float) -> None:
        assert self.state is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._ready(self.state):
                return
            if not self._alive():
                tail = log_tail(self.log_file, 30)
                cause, fix = self._diagnose(tail)
                raise StackError(cause, fix, f"last lines of {self.log_file}:\n{tail}")
            time.sleep(0.2)
        self.kill()
        raise StackError(
            f"the {self.title} did not serve within {timeout_s:.0f}s",
            "the machine may be overloaded; read its log, then retry",
            f"last lines of {self.log_file}:\n{log_tail(self.log_file, 30)}",
        )

    def _alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self.state is not None and pid_alive(self.state.pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Clean shutdown (SIGTERM); SIGKILL if it does not exit in time. The data stays."""
        if self.state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.state.pid, self.stop_signal)
            stop_pid(self.state.pid, timeout_s)
        self._reap()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.state.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        """Wait for a process this object started; its exit code goes to ``exit_code`` (negative: the
        signal that killed it), None when it is not our child or has not exited."""
        self.exit_code = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.exit_code = self._process.wait(timeout=30)
        self._process = None


class Startable(Protocol):
    """A stack server as ``serve`` drives it: the broker and every ``LocalServer``."""

    def start(self, timeout_s: float = ...) -> Any: ...

    def stop(self, timeout_s: float = ...) -> None: ...


def serve(server: Startable, name: str, timeout_s: float = 300.0) -> int:
    """Run ``server`` in the foreground until it exits (1) or this process gets SIGTERM/SIGINT, which
    stop it cleanly (0): what a container's main process must do, for ``fanout-sink stack serve``."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    state = server.start(timeout_s)
    # Credentials stay in the state file: a container's output ends up in shared logs.
    print(json.dumps({"serving": name, "pid": state.pid, "port": state.port}), flush=True)
    while not stopping.wait(0.5):
        if not pid_alive(state.pid):
            server.stop()
            return 1
    server.stop()
    return 0
