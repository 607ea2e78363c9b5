"""The command's help is plain text for operators, and ``--version`` names the engines it runs on.

The module docstrings are reST for developers (``double backticks``, ``:class:`` roles); argparse
prints whatever it is given verbatim, so every parser's help is searched for that markup.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata

import pytest

from fanout_sink.cli import build_parser, main

_REST = re.compile(r"``|:[a-z]+:`|`[^`\s]+`_")


def _parsers(parser: argparse.ArgumentParser, path: str = "fanout-sink") -> Iterator[tuple[str, str]]:
    """(command path, its full help text) for the parser and every sub-command below it."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_help_text_is_plain() -> None:
    helps = dict(_parsers(build_parser()))
    assert {"fanout-sink", "fanout-sink validate", "fanout-sink run", "fanout-sink stack up"} <= set(helps)
    marked = {path: _REST.findall(text) for path, text in helps.items() if _REST.search(text)}
    assert not marked, marked


def test_the_markup_check_catches_rest() -> None:
    """The pattern above finds what the module docstrings use, so the test can fail."""
    assert _REST.search("The ``fanout-sink`` command") and _REST.search("see :class:`Finding`")
    assert not _REST.search("fanout-sink validate --config sink.yaml, then 'fanout-sink run'")


def test_top_level_help_shows_validate_before_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.index("fanout-sink validate --config") < text.index("fanout-sink run --config")


def test_version_names_the_package_and_its_engines() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f"fanout-sink {metadata.version('fanout-sink')}"
    for name, package in (
        ("PySpark", "pyspark"),
        ("PyIceberg", "pyiceberg"),
        ("confluent-kafka", "confluent-kafka"),
    ):
        assert f"{name} {metadata.version(package)}" in lines[1]
    assert re.search(r"librdkafka \d+\.\d+", lines[1])


@pytest.mark.parametrize("command", ["run", "maintain", "sql"])
def test_a_conf_without_equals_is_a_usage_error_naming_the_option(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([command, "--config", "sink.yaml", "--conf", "spark.driver.memory"])
    assert exited.value.code == 2
    assert "argument --conf: takes KEY=VALUE, got 'spark.driver.memory'" in capsys.readouterr().err
    parsed = parser.parse_args([command, "--config", "sink.yaml", "--conf", "spark.a = b=c"])
    assert parsed.conf == [("spark.a", " b=c")]
