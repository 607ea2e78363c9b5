"""The sink app as the operator sees it: a process group to start, watch, signal and restart.

The runner only knows what an operator knows: the process, its exit code and its log. Each start
appends to one log file per run (kept for post-mortems), and a reader thread counts the batch lines so
a cycle can wait until the app really works before breaking it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_BATCH_LINE = re.compile(r"fanout_sink\.app: batch \d+:")
_STARTED_LINE = re.compile(r"fanout_sink\.progress: streaming query .* started")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an app in a child process, without the parent's PySpark gateway.

    A parent that has its own Spark session (a test) exports its gateway port and secret; a child
    that inherits them attaches to that JVM instead of starting its own.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env["PYTHONFAULTHANDLER"] = "1"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return {**env, **(extra or {})}


class AppProcess:
    """One ``fanout-sink run`` at a time, in its own process group (driver, JVM and Python workers)."""

    def __init__(self, command: list[str], log_file: Path, env: dict[str, str]) -> None:
        self.command = command
        self.log_file = log_file
        self.env = env
        self.starts = 0
        self.batches = 0
        self.streaming = False  # this start's query is up (it logs batches only when records arrive)
        self.exits: list[int] = []
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running(), "the app is already running"
        self.starts += 1
        self.streaming = False
        with self.log_file.open("a") as log:
            log.write(f"\n===== start {self.starts} at {time.strftime('%H:%M:%S')} =====\n")
        self._proc = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, args=(self._proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        with self.log_file.open("a", buffering=1) as log:  # line by line: the log is read while it grows
            for line in proc.stderr:
                log.write(line)
                if _STARTED_LINE.search(line):
                    self.streaming = True
                if _BATCH_LINE.search(line):
                    with self._lock:
                        self.batches += 1

    def wait_working(self, timeout_s: float, batch: bool) -> bool:
        """Wait until the query is up and, with ``batch``, one more batch was logged; False if the
        app died or time ran out."""
        with self._lock:
            target = self.batches + (1 if batch else 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.streaming and self.batches >= target:
                    return True
            if not self.running():
                return False
            time.sleep(0.2)
        return False

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code once the app ended by itself, else None (it still runs)."""
        if self._proc is None:
            return None
        try:
            code = self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return code

    def kill_group(self) -> None:
        """SIGKILL the whole group: the driver, its JVM and every Python worker, like a lost machine."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(60)
        self._reap()

    def _reap(self) -> None:
        """After the driver ended, leave nothing of its group behind (a cluster manager would not)."""
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        if self._reader is not None:
            self._reader.join(30)
        code = self._proc.returncode
        self.exits.append(code)
        self._proc = None

    def stop(self, timeout_s: float = 300.0) -> int:
        """SIGTERM: the app finishes its batch, commits and exits; SIGKILL if it does not in time."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        code = self.wait_exit(timeout_s)
        if code is None:
            self.kill_group()
            return -signal.SIGKILL
        return code

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
