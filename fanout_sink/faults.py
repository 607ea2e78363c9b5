"""Named fault-injection points, so tests and the chaos runner break real processes at exact moments.

Exactly-once claims are only worth what the crash tests behind them are worth, and a crash test is
only sharp when it kills the process between two precise steps (say, after table A's commit and
before table B's). The protocol code calls :func:`fault_point` at those steps. It does nothing
unless the environment variable ``FANOUT_SINK_FAULTS`` names the point, as a comma-separated list of
``point=action``:

- ``kill``: SIGKILL the own process (no cleanup, no ``finally``, like a lost machine);
- ``kill-once:PATH``: the same, unless the file ``PATH`` exists; it is created just before the kill,
  so the retried attempt (a Spark task retry, a restarted app) passes the point;
- ``raise``: raise :class:`InjectedFault`;
- ``sleep:SECONDS``: pause, for example to hold a Kafka transaction open;
- ``wait:PATH``: block until the file ``PATH`` exists (a test releases the process when it wants);
- ``when:PATH:ACTION``: do ``ACTION`` (``kill``, ``raise``, ``sleep:SECONDS`` or ``wait:PATH``) once
  each time the file ``PATH`` is found at the point, removing it first; the chaos runner arms a point
  this way at a moment of its choosing, in a process that was started long before (``sleep`` is its
  stalled catalog call, ``wait`` a worker held in its transaction until a second app has started).

A point may be named more than once; its actions run in the order given. That is how one point
carries two ``when:`` actions with different files (the chaos runner's injected commit failure and
its coordinator kill both sit before a table's commit), each armed on its own.

In-process tests can also :func:`register` a callback for a point (for example to commit a
competing snapshot between a table's load and its commit).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fanout_sink.errors import FanoutSinkError

ENV_VAR = "FANOUT_SINK_FAULTS"

_callbacks: dict[str, Callable[..., None]] = {}
_WHEN = re.compile(r"when:(?P<path>.+?):(?P<action>kill|raise|sleep:[0-9.]+|wait:.+)")


class InjectedFault(FanoutSinkError):
    """Raised by a fault point configured with ``raise``: never seen outside tests and chaos runs."""


def _actions() -> dict[str, list[str]]:
    spec = os.environ.get(ENV_VAR, "")
    actions: dict[str, list[str]] = {}
    for point, action in (item.split("=", 1) for item in spec.split(",") if "=" in item):
        actions.setdefault(point.strip(), []).append(action.strip())
    return actions


def fault_point(name: str, **context: object) -> None:
    """Run the faults configured for ``name``, if any; ``context`` is passed to registered callbacks."""
    callback = _callbacks.get(name)
    if callback is not None:
        callback(**context)
    for action in _actions().get(name, ()):
        _act(name, action)


def _act(name: str, action: str) -> None:
    if action.startswith("when:"):
        when = _WHEN.fullmatch(action)
        if when is None:
            raise ValueError(
                f"{ENV_VAR}: {name} must be when:PATH:kill, when:PATH:raise, when:PATH:sleep:SECONDS "
                "or when:PATH:wait:PATH"
            )
        armed, action = when["path"], when["action"]
        try:
            Path(armed).unlink()  # only one process (or thread) wins the removal: the fault fires once
        except FileNotFoundError:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("kill-once:"):
        marker = Path(action.split(":", 1)[1])
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise InjectedFault(f"fault injected at {name} ({ENV_VAR}={os.environ.get(ENV_VAR)})")
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action.startswith("wait:"):
        release = Path(action.split(":", 1)[1])
        while not release.exists():
            time.sleep(0.05)
    else:
        raise ValueError(f"unknown fault action {action!r} for {name} in {ENV_VAR}")


@contextmanager
def register(name: str, callback: Callable[..., None]) -> Iterator[None]:
    """Call ``callback(**context)`` each time the point ``name`` is reached inside the ``with`` block."""
    _callbacks[name] = callback
    try:
        yield
    finally:
        _callbacks.pop(name, None)
