"""The README's main-job command, pointed at the test broker: every sample event lands in its table,
every malformed record in the dead-letter topic, and both engines show the tables."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fanout_sink.catalog import load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.devtools.demo import malformed_events
from fanout_sink.devtools.sample_data import shop_events

pytestmark = pytest.mark.usefixtures("own_spark")


def test_demo_runs_the_app_and_shows_both_engines(bootstrap_servers: str, tmp_path: Path) -> None:
    records = 400
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    result = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "demo", "--bootstrap-servers", bootstrap_servers,
         "--dir", str(tmp_path / "demo"), "--records", str(records)],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    expected: dict[str, set[str]] = {}
    for event in shop_events(records):
        kind = event.key.decode().split("-")[0]
        expected.setdefault(f"shop.{kind}s", set()).add(event.key.decode())
    counts = {m[0]: int(m[1]) for m in re.findall(r"lake\.(shop\.\w+): (\d+) rows", result.stdout)}
    assert counts == {name: len(ids) for name, ids in expected.items()}
    assert f"dead-letter topic shop-demo-dlq: {len(malformed_events(0))} records" in result.stdout
    assert "through Spark SQL" in result.stdout and "revenue" in result.stdout

    # The closing lines, run as printed by a new user: another folder, none of the demo's variables.
    config_file = tmp_path / "demo" / "sink.yaml"
    catalog = load_catalog(load_config(config_file).catalog)
    for name, ids in expected.items():
        got = catalog.load_table(name).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        assert sorted(got) == sorted(ids), f"{name} holds exactly the produced events"
    status = _printed_command(result.stdout, "status")
    cli = str(Path(sys.executable).with_name("fanout-sink"))
    assert status == [cli, "status", "--config", str(config_file)]
    new_user = {k: v for k, v in env.items() if k not in {"FANOUT_SINK_DEMO_DIR", "KAFKA_BOOTSTRAP"}}
    venv_bin = str(Path(cli).parent)
    new_user["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = _run_as_printed(status, new_user, elsewhere)
    for name in expected:
        assert f"  {name}: commit " in shown, shown
    assert "lag 0" in shown and "no table holds a commit" not in shown

    sql = _printed_command(result.stdout, "sql")
    assert sql[:5] == [cli, "sql", "--config", str(config_file), "-e"]
    rows = _run_as_printed(sql, new_user, elsewhere)
    assert rows.startswith("id ") and "(5 rows)" in rows, rows
    assert {line.split(" | ")[0].strip() for line in rows.splitlines()[2:7]} <= expected["shop.orders"]


def _printed_command(stdout: str, command: str) -> list[str]:
    """The ``<path>/fanout-sink <command>`` line the demo printed, split as a shell would."""
    lines = [
        line.strip() for line in stdout.splitlines() if re.match(rf"\S*fanout-sink {command} ", line.strip())
    ]
    assert len(lines) == 1, stdout[-2000:]
    return shlex.split(lines[0])


def _run_as_printed(command: list[str], env: dict[str, str], cwd: Path) -> str:
    """The command exactly as printed, in a shell whose PATH lacks the virtualenv (a new one's)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
