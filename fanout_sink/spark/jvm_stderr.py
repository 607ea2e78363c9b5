"""The driver JVM's standard error without the JVM's own start-up notice.

Spark's launcher starts every driver JVM with ``--add-modules=jdk.incubator.vector``
(``org.apache.spark.launcher.JavaModuleOptions``, not an option the sink can leave out), and the JVM
then writes ``WARNING: Using incubator modules: jdk.incubator.vector`` to its standard error before any
logger exists: the first line of every ``run``, ``sql`` and ``maintain``, and the one line that is not
JSON under ``--log-format json``. No JVM flag silences it. So the JVM PySpark launches gets, as its
standard error, a pipe to a small filter process that copies every line to this process's standard
error except :data:`JVM_NOTICES`. A process, not a thread: the JVM outlives the Python interpreter by
a moment at exit, and its last lines must still reach the terminal. Under ``spark-submit`` the JVM
exists before Python starts, and the notice stays (it is ``spark-submit``'s).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

JVM_NOTICES = ("WARNING: Using incubator modules:",)
"""Lines the JVM writes that no operator can act on, dropped from its standard error."""

_FILTER = """\
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the app, which stops the JVM; not this
drop = tuple(notice.encode() for notice in sys.argv[1:])
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not line.startswith(drop):
        out.write(line)
        out.flush()
"""


@contextlib.contextmanager
def filtered(drop: tuple[str, ...] = JVM_NOTICES) -> Iterator[subprocess.Popen[bytes] | None]:
    """While inside, file descriptor 2 is the filter's pipe: a process started then (the driver JVM)
    keeps it as its standard error, this process gets its own back on leaving. Yields the filter
    (which exits once every writer closed the pipe), or None when standard error is no file."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr, or no descriptor 2: nothing to filter
        yield None
        return
    try:
        notice_filter = subprocess.Popen(
            [sys.executable, "-S", "-c", _FILTER, *drop], stdin=subprocess.PIPE, stdout=saved
        )
    except OSError:
        os.close(saved)
        yield None
        return
    assert notice_filter.stdin is not None
    os.dup2(notice_filter.stdin.fileno(), 2)
    try:
        yield notice_filter
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        notice_filter.stdin.close()  # the JVM's copy keeps the pipe open until it exits
