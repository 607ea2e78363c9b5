"""``fanout-sink run`` as an operator meets it when it seems stuck."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

from chaos.app_process import child_env
from support.sink_factory import SinkFactory


def test_sigusr1_prints_every_thread_stack_and_the_app_keeps_going(sink_factory: SinkFactory) -> None:
    """Real: the CLI in a child process and a TCP listener that never answers (a hung broker: the
    connection is accepted by the kernel, no Kafka reply comes), so the app waits in its pre-flight
    check, for up to ``preflight.BROKER_TIMEOUT_S`` (10 s) after start-up, as a stuck one would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        sink = sink_factory(overrides={"kafka": {"bootstrap.servers": f"127.0.0.1:{hung.getsockname()[1]}"}})
        app = subprocess.Popen(
            sink.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env()
        )
        try:
            hung.settimeout(120)
            # Once connected, the app is in its pre-flight check, past registering the dump signal.
            # The connection stays open and unanswered, as a hung broker's would.
            connection, _ = hung.accept()
            with connection:
                time.sleep(1)
                assert app.poll() is None, "still waiting for the broker"
                app.send_signal(signal.SIGUSR1)
                time.sleep(1)
                assert app.poll() is None, "a dump does not stop the app"
        finally:
            app.kill()
            _, stderr = app.communicate(30)
    assert "most recent call first" in stderr and "fanout_sink/spark/app.py" in stderr, stderr[-2000:]
