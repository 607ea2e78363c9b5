"""Processes: whether a pid still runs, and running a set-up command that must succeed.

Lowest layer, because both the product (the driver JVM's archive dumps, named by the dumping
process's pid; the executors' pack built with pip) and the developer stack (its servers' state files,
initdb) need them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fanout_sink.errors import StackError


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def run_or_raise(
    command: Sequence[str], cause: str, fix: str, timeout_s: float, tail_lines: int = 20
) -> None:
    """Run a set-up step; on a non-zero exit, a ``StackError`` with ``cause``, ``fix`` and the end of its
    output, because a set-up failure is only fixable by someone who sees what the tool said."""
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-tail_lines:])
        raise StackError(f"{cause} (exit code {result.returncode})", fix, tail)
