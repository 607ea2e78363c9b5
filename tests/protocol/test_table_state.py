"""Summary state is namespaced by sink and found by walking back past other writers' snapshots."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from support.common import ARROW_SCHEMA, create_tables

from fanout_sink.protocol import table_state


def _append(table: Any, ident: int, props: dict[str, str]) -> None:
    table.append(pa.Table.from_pylist([{"id": ident, "topic": "t"}], ARROW_SCHEMA), snapshot_properties=props)


def test_two_sinks_share_a_table_and_other_writers_are_walked_past(catalog: Any) -> None:
    create_tables(catalog, ["shared"])
    table = catalog.load_table("sink.shared")
    assert table_state.read_state(table, "x") == table_state.TableState()
    _append(table, 1, table_state.summary_properties("x", {0: 10}, "cx", 1000))
    _append(table, 2, table_state.summary_properties("y", {0: 4}, "cy", None))
    _append(table, 3, {})  # a writer that is not a sink
    table = catalog.load_table("sink.shared")
    x, y = table_state.read_state(table, "x"), table_state.read_state(table, "y")
    assert (x.commit_id, x.control_offsets, x.vtts_ms) == ("cx", {0: 10}, 1000)
    assert (y.commit_id, y.next_control_offset(), y.vtts_ms) == ("cy", 4, None)
    assert len({x.snapshot_id, y.snapshot_id, table.current_snapshot().snapshot_id}) == 3


def test_sink_tables_lists_only_the_tables_a_sink_committed_to(catalog: Any) -> None:
    create_tables(catalog, ["a", "b", "c"])
    _append(catalog.load_table("sink.b"), 1, table_state.summary_properties("x", {0: 3}, "c1", None))
    _append(catalog.load_table("sink.a"), 2, table_state.summary_properties("x", {0: 5}, "c2", None))
    _append(catalog.load_table("sink.c"), 3, table_state.summary_properties("y", {0: 1}, "c3", None))
    found = table_state.sink_tables(catalog, "x")
    assert [(t.identifier, t.state.commit_id) for t in found] == [("sink.a", "c2"), ("sink.b", "c1")]


def test_persisting_the_floor_never_sets_an_older_one_over_a_concurrent_sink_commit(catalog: Any) -> None:
    """Tables committed before the sink set properties hold the floor in summaries only; maintenance
    writes it as properties before expiry. A sink commit between its read and its commit wins."""
    create_tables(catalog, ["old"])
    _append(catalog.load_table("sink.old"), 1, table_state.summary_properties("x", {0: 3}, "c1", None))
    table = catalog.load_table("sink.old")
    assert table_state.properties_behind(table, "x") == table_state.summary_properties(
        "x", {0: 3}, "c1", None
    )
    commit_table = catalog.commit_table
    raced: list[int] = []

    def sink_commits_first(*args: Any) -> Any:
        if not raced:
            raced.append(1)
            newer = table_state.summary_properties("x", {0: 7}, "c2", None)
            with catalog.load_table("sink.old").transaction() as txn:  # as the coordinator commits
                txn.append(
                    pa.Table.from_pylist([{"id": 2, "topic": "t"}], ARROW_SCHEMA), snapshot_properties=newer
                )
                txn.set_properties(newer)
        return commit_table(*args)

    catalog.commit_table = sink_commits_first
    assert table_state.persist_state(catalog, "sink.old", "x") == {}  # conflict, re-read: nothing behind
    catalog.commit_table = commit_table
    assert raced == [1]
    table = catalog.load_table("sink.old")
    assert table.metadata.properties[table_state.key("x", "control-offsets")] == '{"0": 7}'
    create_tables(catalog, ["older"])
    _append(catalog.load_table("sink.older"), 1, table_state.summary_properties("x", {0: 5}, "c3", 9))
    written = table_state.persist_state(catalog, "sink.older", "x")
    assert written == table_state.summary_properties("x", {0: 5}, "c3", 9)
    assert table_state.properties_behind(catalog.load_table("sink.older"), "x") == {}
