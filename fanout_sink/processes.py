"""Whether a process id still names a running process: the one check every pid file and dump name needs.

Lowest layer and stdlib only, because both the product (the driver JVM's archive dumps, named by the
dumping process's pid) and the developer stack (its servers' state files) ask it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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
