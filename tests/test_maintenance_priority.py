"""The order a maintenance run takes the sink's tables in, from their metadata alone
(``fanout_sink/maintenance/priority.py``): the tables that gain most first, so that a run stopped at
its ``max-duration`` has done the ones that mattered."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow as pa
from support.common import ARROW_SCHEMA, create_tables

from fanout_sink.config.maintenance import MaintenanceSettings
from fanout_sink.maintenance import priority
from fanout_sink.maintenance.priority import Gain
from fanout_sink.protocol import table_state


def _commits(catalog: Any, name: str, files: int) -> Any:
    """``files`` one-row appends in one catalog commit (a file and a snapshot each)."""
    table = catalog.load_table(f"sink.{name}")
    with table.transaction() as txn:
        for i in range(files):
            txn.append(pa.Table.from_pylist([{"id": i, "topic": "t"}], ARROW_SCHEMA))
    return catalog.load_table(f"sink.{name}")


def test_compaction_gain_is_the_files_a_rewrite_would_remove_from_the_snapshot_summary(catalog: Any) -> None:
    create_tables(catalog, ["many", "few"])
    many, few = _commits(catalog, "many", 12), _commits(catalog, "few", 3)
    settings = MaintenanceSettings(target_file_size_bytes=1 << 20, min_input_files=5)
    assert priority.compaction_gain(many, settings) == 11  # 12 small files into one
    assert priority.compaction_gain(few, settings) == 0  # below min-input-files
    big = settings.model_copy(update={"target_file_size_bytes": 100})
    assert priority.compaction_gain(many, big) == 0  # none is small against a 100-byte target


def test_expiry_gain_counts_snapshots_past_retention_beyond_those_kept(catalog: Any) -> None:
    create_tables(catalog, ["t"])
    table = _commits(catalog, "t", 6)
    now_ms = max(s.timestamp_ms for s in table.metadata.snapshots) + 1
    settings = MaintenanceSettings(max_snapshot_age=timedelta(0), min_snapshots_to_keep=2)
    assert priority.expiry_gain(table, settings, now_ms) == 4
    assert priority.expiry_gain(table, MaintenanceSettings(), now_ms) == 0  # 5 days: none is that old


def test_rank_puts_the_tables_that_gain_most_first_and_never_maintained_before_recent(
    catalog: Any,
) -> None:
    create_tables(catalog, ["cold", "hot", "warm", "done"])
    tables = {name: _commits(catalog, name, files) for name, files in [("cold", 1), ("hot", 30), ("warm", 8)]}
    done = _commits(catalog, "done", 8)
    with done.transaction() as txn:
        txn.set_properties({table_state.MAINTENANCE_LAST_RUN_MS: "1000"})
    tables["done"] = catalog.load_table("sink.done")
    settings = MaintenanceSettings(target_file_size_bytes=1 << 20)
    order = priority.rank([(f"sink.{n}", t) for n, t in tables.items()], lambda _: settings)
    assert [g.table for g in order] == ["sink.hot", "sink.warm", "sink.done", "sink.cold"]
    assert [g.compaction for g in order] == [29, 7, 7, 0]
    assert order[0].describe() == "sink.hot (compaction 29, expiry 0)"


def test_ties_go_to_the_table_that_waited_longest_then_by_name() -> None:
    gains = [
        Gain("sink.b", 5, 0, 60.0),
        Gain("sink.a", 5, 0, 60.0),
        Gain("sink.c", 2, 4, 3600.0),  # 6 by compaction and expiry together
        Gain("sink.d", 6, 0, None),
        Gain("sink.e", 6, 0, 10.0),
    ]
    assert [g.table for g in priority.by_gain(gains)] == ["sink.d", "sink.c", "sink.e", "sink.a", "sink.b"]
