"""Running ``fanout-sink sql`` as a user would: a sink YAML naming a catalog, the command in a child
process (its own JVM), and the rows PyIceberg reads in the form the command prints them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.spark.sql_shell import plain


def write_sql_config(folder: Path, settings: CatalogSettings) -> Path:
    """A minimal sink YAML whose ``catalog:`` section is ``settings`` (all ``sql`` reads of it)."""
    path = folder / "sink.yaml"
    sink = {
        "name": "sql-cli-test",
        "source": {"topics": ["unused"], "format": "json"},
        "tables": {"unused.routed": {"when": "true"}},
        "catalog": {"name": settings.name, **settings.properties()},
    }
    path.write_text(yaml.safe_dump(sink))
    return path


def run_sql_cli(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``fanout-sink sql <args>`` in a child process, as a shell would start it (no gateway of ours)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYSPARK_GATEWAY")}
    return subprocess.run(
        [sys.executable, "-m", "fanout_sink.cli", "sql", *args],
        input=stdin if stdin is not None else "", capture_output=True, text=True, timeout=600,
        check=False, env=env, cwd=cwd,
    )  # fmt: skip


def pyiceberg_rows(settings: CatalogSettings, identifier: str, order_by: str) -> list[dict[str, Any]]:
    """The table's rows through PyIceberg, each value as ``fanout-sink sql --format json`` prints it."""
    table = load_catalog(settings).load_table(identifier).scan().to_arrow().sort_by(order_by)
    return [{key: plain(value) for key, value in row.items()} for row in table.to_pylist()]
