"""``fanout-sink run`` as an operator meets it when it seems stuck."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from fanout_sink.devtools.chaos.app_process import child_env
from fanout_sink.devtools.stack.broker import free_port


def test_sigusr1_prints_every_thread_stack_and_the_app_keeps_going(tmp_path: Path) -> None:
    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {  # nothing listens on this port: the app waits for the broker, as a stuck one would
                "name": "stuck",
                "kafka": {"bootstrap.servers": f"127.0.0.1:{free_port()}"},
                "source": {"topics": ["t"]},
                "tables": {"a.b": {}},
            }
        )
    )
    app = subprocess.Popen(
        [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        time.sleep(4)
        assert app.poll() is None, "still waiting for the broker"
        app.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert app.poll() is None, "a dump does not stop the app"
    finally:
        app.kill()
        _, stderr = app.communicate(30)
    assert "most recent call first" in stderr and "fanout_sink/spark/app.py" in stderr, stderr[-2000:]
