"""The sink's own log: one handler, plain text or JSON lines, the same on the driver and executors.

An operator reads this log for the events that matter (a batch, a commit round, a retry, an error
with its fix); everything else goes to DEBUG. The log is written by several processes, the driver and
every executor's Python workers, so each one calls :func:`configure` with the same settings (the
``logging:`` section travels to the executors inside the pickled config), and their lines look alike.

JSON lines carry ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, any of
:data:`FIELDS` a log call passed in ``extra``, and ``traceback`` when the line reports a failure.
A traceback is a multi-line text that a log shipper would split, so a line that has one keeps it in
that one field (plain format: indented under the line): at DEBUG only. Above DEBUG a line carries no
traceback: it names the file that holds it instead (:func:`keep_traceback`), so an operator's log is
one line per event, whoever logged it with ``exc_info``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

LogFormat = Literal["plain", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

ROOT = "fanout_sink"
"""The logger every module of the sink logs under (``logging.getLogger(__name__)``)."""

FIELDS = ("batch", "attempt", "commit_id", "table", "topic", "partition", "offset")
"""Structured fields a log call may pass in ``extra=`` (and the JSON format shows as keys)."""

TRACEBACK = "traceback"
"""The ``extra=`` key for a failure's text that is not this process's exception (a Spark task's
Python traceback, which reaches the driver inside a Java exception's message)."""

TRACEBACKS_ENV = "FANOUT_SINK_TRACEBACKS"
"""The folder :func:`keep_traceback` writes to (default: ``fanout-sink-tracebacks`` in the system's
temporary folder)."""

TRACEBACKS_KEPT = 200
"""The newest this many traceback files are kept: a failure repeated every round for hours (a catalog
away) must not fill the folder."""

_HANDLER = "fanout-sink"
_PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The record's failure text: its exception (``exc_info``) or a ``traceback`` passed in ``extra``."""
    if record.exc_info:
        return formatter.formatException(record.exc_info)
    text = getattr(record, TRACEBACK, None)
    return str(text).rstrip() if text else None


def keep_traceback(name: str, text: str | None) -> str:
    """``text`` (a failure's traceback) written to a file of its own, and the words that name it for
    a log line (``; traceback in <path>``): the log says what failed in one line, the file says where.
    Empty when there is no text, or when it cannot be written (the DEBUG line still has it)."""
    if not text:
        return ""
    folder = Path(os.environ.get(TRACEBACKS_ENV) or Path(tempfile.gettempdir()) / "fanout-sink-tracebacks")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
    path = folder / f"{stamp}-{name}-{os.getpid()}.txt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(text.rstrip() + "\n", encoding="utf-8")
        for old in sorted(folder.glob("*.txt"))[:-TRACEBACKS_KEPT]:  # names sort by time
            old.unlink(missing_ok=True)
    except OSError:
        return ""
    return f"; traceback in {path}"


def _kept_elsewhere(formatter: logging.Formatter, record: logging.LogRecord) -> logging.LogRecord:
    """A record above DEBUG with a traceback, as the same record whose message names the file that now
    holds the traceback (:func:`keep_traceback`) and that carries none; any other record as it is (a
    traceback that cannot be written stays in the record)."""
    if record.levelno <= logging.DEBUG:
        return record
    details = _traceback(formatter, record)
    kept = keep_traceback(record.name.rsplit(".", 1)[-1], details) if details else ""
    if not kept:
        return record
    message = record.getMessage()
    error = record.exc_info[1] if record.exc_info else None
    if error is not None:  # the exception's own line, unless the message says it already
        first = (str(error).strip().splitlines() or [""])[0]
        if not first or first not in message:
            message += f": {type(error).__name__}" + (f": {first}" if first else "")
    fields = {**record.__dict__, "msg": message + kept, "args": None}
    return logging.makeLogRecord({**fields, "exc_info": None, "exc_text": None, TRACEBACK: None})


class PlainFormatter(logging.Formatter):
    """``time LEVEL logger: message``; at DEBUG, a failure's traceback on the lines below."""

    def __init__(self) -> None:
        super().__init__(_PLAIN)

    def format(self, record: logging.LogRecord) -> str:
        record = _kept_elsewhere(self, record)
        text = super().format(record)  # with the exception's traceback, if any
        details = None if record.exc_info else _traceback(self, record)
        return f"{text}\n{details}" if details else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, structured fields, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        record = _kept_elsewhere(self, record)
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        details = _traceback(self, record)
        if details:
            entry[TRACEBACK] = details
        return json.dumps(entry, default=str)


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else PlainFormatter()


def configure(log_format: LogFormat = "plain", level: LogLevel = "INFO") -> None:
    """The sink's log on stderr in ``log_format`` from ``level`` on; calling it again re-applies.

    The handler is the sink's own (not the root logger's), so the log shows whether or not a library
    configured the root logger first, and py4j's INFO chatter stays out.
    """
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER)
        logger.addHandler(handler)
        logger.propagate = False
    handler.setFormatter(formatter(log_format))
