"""Reading every table of a sink at one point of the stream, from the tables' summaries alone.

Rounds are written here as the coordinator writes them (one snapshot per table it commits, with the
round's commit id, end and table count), so each case states exactly which table a round committed,
which one failed and which had no files in it. A real coordinator writing those keys across a failed
table commit is ``tests/protocol/test_consistent_rounds.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.common import ARROW_SCHEMA, NAMESPACE, commit_as_round, create_tables
from support.sql_cli import write_sql_config

from fanout_sink import cli, consistent_read
from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark import consistent_views

SINK = "shop"


def _commit(
    catalog: Any, name: str, commit_id: str, end: int, round_tables: int | None, ids: list[int]
) -> None:
    commit_as_round(catalog, SINK, name, commit_id, end, round_tables, ids)


def _rows(catalog: Any, point: consistent_read.ConsistentPoint) -> dict[str, list[int]]:
    return {
        identifier.split(".")[-1]: sorted(
            point.scan(catalog.load_table(identifier)).to_arrow().column("id").to_pylist()
        )
        for identifier in point.snapshots
    }


def test_a_failed_table_commit_holds_the_point_and_a_table_without_files_is_read_before_its_later_commit(
    catalog: Any,
) -> None:
    create_tables(catalog, ["orders", "payments", "refunds", "audit"])
    _commit(catalog, "orders", "r1", 10, 2, [1])
    _commit(catalog, "payments", "r1", 10, 2, [1])
    # r2: orders committed, payments' commit failed (its files wait for the next round)
    _commit(catalog, "orders", "r2", 20, 2, [2])
    point = consistent_read.latest_point(catalog, SINK)
    assert (point.commit_id, point.control_offset) == ("r1", 10)
    assert _rows(catalog, point) == {"orders": [1], "payments": [1]}, "orders read ahead of payments"

    # r3: payments' files of r2 and refunds' first; orders had none in r3
    _commit(catalog, "payments", "r3", 30, 2, [2])
    _commit(catalog, "refunds", "r3", 30, 2, [3])
    point = consistent_read.latest_point(catalog, SINK)
    assert (point.commit_id, point.control_offset) == ("r3", 30)
    assert _rows(catalog, point) == {"orders": [1, 2], "payments": [1, 2], "refunds": [3]}

    # r4: orders and audit committed, refunds failed: the point stays at r3, where orders (no files
    # in r3, committed again in r4) is read at its r2 snapshot and audit did not exist yet
    _commit(catalog, "orders", "r4", 40, 3, [4])
    _commit(catalog, "audit", "r4", 40, 3, [4])
    point = consistent_read.latest_point(catalog, SINK)
    assert point.commit_id == "r3"
    orders = catalog.load_table(f"{NAMESPACE}.orders")
    r2_snapshot = orders.metadata.snapshots[1].snapshot_id
    assert point.snapshots[f"{NAMESPACE}.orders"] == r2_snapshot != orders.current_snapshot().snapshot_id
    assert point.snapshots[f"{NAMESPACE}.audit"] is None
    assert _rows(catalog, point) == {"audit": [], "orders": [1, 2], "payments": [1, 2], "refunds": [3]}


def test_a_round_whose_end_cut_a_worker_transaction_is_not_a_point(catalog: Any) -> None:
    """Without ``round-tables`` (the round's end cut a transaction, or a sink version before it)
    a round is never a point, even when every table it touched committed."""
    create_tables(catalog, ["orders", "payments"])
    _commit(catalog, "orders", "r1", 10, 2, [1])
    _commit(catalog, "payments", "r1", 10, 2, [1])
    _commit(catalog, "orders", "r2", 20, None, [2])
    assert consistent_read.latest_point(catalog, SINK).commit_id == "r1"


def test_without_a_whole_round_the_error_says_why_and_what_to_do(catalog: Any) -> None:
    create_tables(catalog, ["orders", "payments"])
    with pytest.raises(
        consistent_read.NoConsistentPointError, match="no table of the catalog holds a commit"
    ):
        consistent_read.latest_point(catalog, SINK)
    _commit(catalog, "orders", "r1", 10, None, [1])  # a sink version that did not record the count
    with pytest.raises(consistent_read.NoConsistentPointError, match="read without --consistent") as raised:
        consistent_read.latest_point(catalog, SINK)
    assert "\n" not in str(raised.value)


def test_another_writers_snapshot_on_top_of_the_point_is_read(catalog: Any) -> None:
    """A snapshot without the sink's keys after the table's snapshot of the point (maintenance, an
    other writer) is what the table holds there."""
    create_tables(catalog, ["orders", "payments"])
    _commit(catalog, "orders", "r1", 10, 2, [1])
    _commit(catalog, "payments", "r1", 10, 2, [1])
    catalog.load_table(f"{NAMESPACE}.orders").append(
        pa.Table.from_pylist([{"id": 9, "topic": "t"}], ARROW_SCHEMA)
    )
    top = catalog.load_table(f"{NAMESPACE}.orders").current_snapshot().snapshot_id
    _commit(catalog, "orders", "r2", 20, 2, [2])  # payments failed in r2
    point = consistent_read.latest_point(catalog, SINK)
    assert point.snapshots[f"{NAMESPACE}.orders"] == top
    assert _rows(catalog, point) == {"orders": [1, 9], "payments": [1]}


def test_a_table_whose_snapshot_at_the_point_was_expired_is_named(catalog: Any) -> None:
    create_tables(catalog, ["orders", "payments"])
    _commit(catalog, "orders", "r1", 10, 2, [1])
    _commit(catalog, "payments", "r1", 10, 2, [1])
    _commit(catalog, "payments", "r2", 20, 1, [2])
    _commit(catalog, "orders", "r3", 30, 2, [3])  # payments failed in r3: the point is r2
    orders = catalog.load_table(f"{NAMESPACE}.orders")
    orders.maintenance.expire_snapshots().by_id(orders.metadata.snapshots[0].snapshot_id).commit()
    with pytest.raises(consistent_read.NoConsistentPointError, match="expired") as raised:
        consistent_read.latest_point(catalog, SINK)
    assert f"table {NAMESPACE}.orders no longer keeps" in str(raised.value)


def test_sql_consistent_without_a_point_says_so_in_one_line_before_spark_starts(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fast test: starting Spark here would fail it (tests/support/fixture_markers.py)."""
    create_tables(catalog, ["orders"])
    config = write_sql_config(tmp_path, catalog_settings)
    assert cli.main(["sql", "--config", str(config), "--consistent", "-e", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fanout-sink: no table of the catalog holds a commit of sink 'sql-cli-test'")
    assert err.count("\n") == 1


def test_each_table_becomes_a_view_of_its_own_name_at_its_snapshot() -> None:
    point = consistent_read.ConsistentPoint(
        "shop", "r3", 30, {"shop.orders": 11, "audit.orders": None, "shop.pay`ments": 12}
    )
    assert consistent_views.statements(point, "lake") == {
        "audit_orders": "CREATE OR REPLACE TEMPORARY VIEW `audit_orders` AS SELECT * FROM "
        "`lake`.`audit`.`orders` WHERE false",
        "pay`ments": "CREATE OR REPLACE TEMPORARY VIEW `pay``ments` AS SELECT * FROM "
        "`lake`.`shop`.`pay``ments` VERSION AS OF 12",
        "shop_orders": "CREATE OR REPLACE TEMPORARY VIEW `shop_orders` AS SELECT * FROM "
        "`lake`.`shop`.`orders` VERSION AS OF 11",
    }
