"""The table-commit benchmark commits every table of each round, one snapshot per table and round."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import table_commits
from bench.context import catalog_settings

from fanout_sink.catalog import load_catalog

pytestmark = pytest.mark.bench


def test_benchmark_commits_every_table_each_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert table_commits.main(["--tables", "5", "--rounds", "2", "--work-dir", str(tmp_path)]) == 0
    assert "round 2: 5 tables" in capsys.readouterr().out
    catalog = load_catalog(catalog_settings(tmp_path))
    for name in catalog.list_tables(table_commits.NAMESPACE):
        table = catalog.load_table(name)
        assert len(table.snapshots()) == 2 and len(table.scan().to_arrow()) == 2 * 20
