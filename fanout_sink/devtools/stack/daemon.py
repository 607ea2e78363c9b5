"""The broker as a long-lived local service for people: ``fanout-sink stack up | down | status``.

State lives in one folder (default ``<cache>/stack``), so ``up`` twice reuses the running broker
and ``down`` finds it from any shell.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import (
    BrokerState,
    KafkaBroker,
    is_running,
    load_state,
    port_is_free,
    stop_pid,
)

DEFAULT_PORT = 9092


def default_dir() -> Path:
    return jars.cache_dir() / "stack"


def up(work_dir: Path, port: int | None = None) -> tuple[BrokerState, bool]:
    """The running broker's state and whether this call started it (False: it was already up)."""
    state = load_state(work_dir)
    if state is not None and is_running(state):
        return state, False
    if port is None and state is None and port_is_free(DEFAULT_PORT):
        port = DEFAULT_PORT
    return KafkaBroker(work_dir, port=port).start(), True


def down(work_dir: Path) -> BrokerState | None:
    """Stop the broker if it runs; its data stays for the next ``up``."""
    state = load_state(work_dir)
    if state is not None:
        stop_pid(state.pid)
    return state


def status(work_dir: Path) -> dict[str, Any]:
    state = load_state(work_dir)
    running = state is not None and is_running(state)
    report: dict[str, Any] = {"running": running, "dir": str(work_dir)}
    if state is not None:
        report.update(asdict(state))
        report["bootstrap.servers"] = state.bootstrap_servers
    return report
