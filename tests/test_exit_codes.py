"""The README's exit-code table, held by running each of its rows: 0 done, 1 unexpected, 2 a config or
data stop, and what ``status`` (and ``maintain``) return for a broker or a catalog that is down (issue
49). Each fault case checks the one line it prints and that no traceback is; a closed port
(127.0.0.1:1) stands for a broker or a REST catalog that is down, so no case waits for a timeout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOWN = "127.0.0.1:1"
"""A closed port: refused at once, as a broker or a catalog that is down."""


def documented_codes() -> set[int]:
    """The codes of the README's "Exit codes" table."""
    section = ROOT.joinpath("README.md").read_text().split("### Exit codes", 1)[1].split("\n#", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", section, flags=re.MULTILINE)}


RUN_BY_THIS_FILE = {0, 1, 2, 3, 4, 5}


def test_every_documented_exit_code_has_a_case_here() -> None:
    assert documented_codes() == RUN_BY_THIS_FILE


def _sink_yaml(folder: Path, bootstrap: str, catalog: dict[str, str], topic: str = "t") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sink.yaml"
    sink = {
        "name": "codes",
        "kafka": {"bootstrap.servers": bootstrap},
        "source": {"topics": [topic], "format": "json"},
        "catalog": catalog,
        "tables": {"a.b": {}},
    }
    path.write_text(yaml.safe_dump(sink))
    return path


def _existing_catalog(folder: Path) -> dict[str, str]:
    """An empty SQLite catalog that exists (made as ``run`` makes it)."""
    settings = CatalogSettings(
        name="codes", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder / 'wh'}"
    )
    load_catalog(settings).list_namespaces()
    return {"name": settings.name, **settings.properties()}


def _one_line(err: str, start: str) -> str:
    assert "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert line.startswith(start), line
    return line


def test_0_done(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--offline", "--config", str(ROOT / "routing" / "static-multi-table.yaml")]) == 0
    out, err = capfd.readouterr()
    assert out.strip().splitlines()[-1].startswith("valid offline:") and not err


def test_1_unexpected_is_a_bug_with_its_traceback(tmp_path: Path) -> None:
    config = _sink_yaml(tmp_path, DOWN, _existing_catalog(tmp_path))
    broken = (
        "import sys, fanout_sink.status as s\n"
        "def boom(*args, **kwargs): raise RuntimeError('a bug')\n"
        "s.run = boom\n"
        "from fanout_sink.cli import main\n"
        f"sys.exit(main(['status', '--config', {str(config)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", broken], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "RuntimeError: a bug" in done.stderr


def test_2_config_or_data_stop(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: {topics: [t]}\ntables: {a.b: {when: 1}}\nnot-a-key: 1\n")
    assert main(["validate", "--offline", "--config", str(bad)]) == 2
    assert capfd.readouterr().err.startswith("fanout-sink: bad.yaml: ")
    missing = {"name": "lake", "type": "sql", "uri": "sqlite:///typo/catalog.db"}
    config = _sink_yaml(tmp_path / "sql", DOWN, missing)
    assert main(["sql", "--config", str(config), "-e", "SELECT 1"]) == 2
    _one_line(
        capfd.readouterr().err, f"fanout-sink: catalog 'lake': {tmp_path / 'sql' / 'typo' / 'catalog.db'} "
    )
    assert not (tmp_path / "sql" / "typo").exists()


def test_3_kafka_unreachable(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = _sink_yaml(tmp_path, DOWN, _existing_catalog(tmp_path))
    assert main(["status", "--config", str(config)]) == 3
    out, err = capfd.readouterr()
    _one_line(err, f'fanout-sink status: Kafka at kafka."bootstrap.servers"={DOWN} is unreachable')
    assert "(no table holds a commit of this sink yet)" in out, "the tables were read"
    # maintain: one line of cause before any Spark starts, not a timeout per table.
    assert main(["maintain", "--config", str(config)]) == 3
    line = _one_line(
        capfd.readouterr().err, f'fanout-sink maintain: Kafka at kafka."bootstrap.servers"={DOWN}'
    )
    assert "nothing was maintained" in line


def _cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own: its real standard error, as an operator sees it."""
    return subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", *args],
        check=False, capture_output=True, text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_4_catalog_unreachable(
    make_topic: Callable[..., str], bootstrap_servers: str, tmp_path: Path
) -> None:
    topic = make_topic("codes")
    rest = {"name": "codes", "type": "rest", "uri": f"http://{DOWN}/catalog"}
    config = _sink_yaml(tmp_path, bootstrap_servers, rest, topic)
    done = _cli("status", "--config", str(config))
    assert done.returncode == 4, done.stderr
    _one_line(done.stderr, "fanout-sink status: catalog 'codes' (catalog.type=rest")
    assert f"{topic}[0]: committed - end 0 lag 0" in done.stdout, "the lag was read"


def test_5_both_down_the_issue_s_command_on_a_shipped_example_from_another_folder(tmp_path: Path) -> None:
    """``KAFKA_BOOTSTRAP=127.0.0.1:1 fanout-sink status`` on the shipped example, run from another
    folder: its relative catalog path is the YAML's folder's, named and not created; no traceback."""
    for folder in ("routing", "schemas"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = tmp_path / "routing" / "static-multi-table.yaml"
    done = _cli("status", "--config", str(config), cwd=elsewhere, env={"KAFKA_BOOTSTRAP": DOWN})
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    kafka, catalog = done.stderr.strip().splitlines()
    assert kafka.startswith(f'fanout-sink status: Kafka at kafka."bootstrap.servers"={DOWN} is unreachable')
    missing = tmp_path / "routing" / "warehouse" / "catalog.db"
    assert catalog.startswith(f"fanout-sink status: catalog 'lake': {missing} does not exist"), catalog
    assert not missing.parent.exists() and not (elsewhere / "warehouse").exists()
    assert "(not read: see the catalog line above)" in done.stdout
