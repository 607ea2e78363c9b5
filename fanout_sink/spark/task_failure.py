"""What a failed Spark job says, cut down to what an operator reads: one line, one Python traceback.

A task's exception reaches the driver as a Java exception whose message embeds the task's Python
traceback, between Java stack traces, once for the failed task and again in the ``Caused by``
part. Logged as such, one failure is a hundred lines that repeat the traceback; :func:`task_failure`
keeps the task's Python traceback (the innermost, when the text is a query's end, whose own
traceback wraps the job's) and its last line, the exception, as the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = "Traceback (most recent call last):"
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?:.*\n)*?(?=\n|\tat |\Z)")
_JAVA_CAUSE = re.compile(r"^: (.+)$", re.MULTILINE)  # py4j puts the Java exception on a ': ' line


@dataclass(frozen=True)
class TaskFailure:
    summary: str
    """One line: the Python exception of the failed task (all of its message), else the Java
    exception's first line."""
    traceback: str | None
    """The failed task's Python traceback, when the failure came from Python."""


def task_failure(error: BaseException | str) -> TaskFailure:
    """The failure in ``error``, a Spark job's exception or its text."""
    text = str(error)
    found = _TRACEBACK.search(text + "\n")
    if found is not None:
        traceback = found.group(0).rstrip()
        # A query's end starts with the foreachBatch's own traceback, whose exception (py4j's) carries
        # the job's text and the task's traceback in it: the innermost one is the failure.
        traceback = traceback[traceback.rindex(_HEADER) :]
        lines = traceback.splitlines()[1:]
        # The exception starts at the first line that is not an indented frame; its message may go on.
        start = next((i for i, line in enumerate(lines) if not line.startswith(" ")), len(lines) - 1)
        return TaskFailure(" ".join(line.strip() for line in lines[start:]), traceback)
    cause = _JAVA_CAUSE.search(text)
    first = cause.group(1) if cause is not None else (text.strip().splitlines() or [repr(error)])[0]
    return TaskFailure(first.strip(), None)
