"""The lane's shared broker, watched. When it dies mid-run, every later test that takes it fails on
client time-outs that hide the cause (CI stop 41: 143 tests failed on ``Connection refused``, nothing
said why). The first test set up after the death fails with the exit code, the end of the broker's log
and the kernel's out-of-memory lines; later ones fail at once, pointing at that first report."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fanout_sink.devtools.stack.broker import KafkaBroker, log_tail

_found_dead: list[str] = []
"""The node id of the test whose set-up first found the broker dead."""


def _kernel_oom_lines() -> str:
    """What the kernel said about killing processes for memory, if it lets us read its log."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "(dmesg could not be run)"
    lines = [line for line in out.splitlines() if "oom" in line.lower() or "killed process" in line.lower()]
    return "\n".join(lines[-10:]) or "(none)"


def _machine_now() -> str:
    """Load and free memory when the death was found: a loaded or full machine is the usual suspect."""
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return "(no /proc)"
    return f"load average {' '.join(load)}, MemAvailable {meminfo.get('MemAvailable', '?').strip()}"


def death_report(broker: KafkaBroker, code: int) -> str:
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return (
        f"the lane's shared Kafka broker is gone ({how}); every test that takes it fails from here on.\n"
        f"last lines of {broker.log_file}:\n{log_tail(broker.log_file, 40)}\n"
        f"kernel out-of-memory lines:\n{_kernel_oom_lines()}\n"
        f"the machine now: {_machine_now()}"
    )


@pytest.fixture(autouse=True)
def _shared_broker_alive(request: pytest.FixtureRequest) -> None:
    if "kafka_broker" not in request.fixturenames:
        return
    if _found_dead:
        pytest.fail(f"the lane's shared Kafka broker died earlier; see the set-up error of {_found_dead[0]}")
    broker: KafkaBroker = request.getfixturevalue("kafka_broker")
    code = broker.exit_code()
    if code is not None:
        _found_dead.append(request.node.nodeid)
        pytest.fail(death_report(broker, code))
