"""A round's table commits landed in groups (``commit_runners``, SQL catalogs): each table's files and
metadata staged, fsynced together, then the group's pointers swapped in one catalog transaction, each
only where it still points at the metadata its commit was staged on."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from sqlalchemy import event
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.catalog import load_catalog

TABLES = "abcdef"


def _sink(sink_factory: SinkFactory) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Six tables, ids 0-35 delivered round-robin and announced on the control topic."""
    sink = sink_factory(partitions={"src": 1}, tables=TABLES, prefix="gc")
    values = [{"id": i, "table": TABLES[i % len(TABLES)]} for i in range(36)]
    produce_json(sink.bootstrap, sink.topic, 0, values)
    expected = {t: [i for i in range(36) if TABLES[i % len(TABLES)] == t] for t in TABLES}
    return sink, expected


def test_a_rounds_pointers_move_in_one_transaction_and_a_pointer_moved_before_it_retries_that_table_alone(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """I3/I4: another writer commits to sink.c after the group was staged and before its pointers
    swap: only sink.c's swap finds another pointer; it is reloaded, re-checked and committed alone,
    and the five others land once, all in one catalog transaction."""
    sink, expected = _sink(sink_factory)
    sink.batch()
    coordinator = sink.coordinator()
    commits: list[int] = []
    event.listen(sink.catalog.engine, "commit", lambda _connection: commits.append(1))
    other = load_catalog(sink.settings)  # someone else's catalog (its own connections)
    moved: list[str] = []

    def another_writer(**_: Any) -> None:
        if not moved:
            table = other.load_table("sink.c")
            table.transaction().set_properties({"owner": "someone-else"}).commit_transaction()
            moved.append(table.name()[-1])

    with faults.register("coordinator.before-pointer-swap", another_writer):
        result = coordinator.commit_round()
    assert moved == ["c"], "nothing moved a pointer between the group's staging and its swap"
    assert {t: c.outcome for t, c in result.tables.items()} == dict.fromkeys(
        [f"sink.{t}" for t in TABLES], "committed"
    )
    assert [result.tables[f"sink.{t}"].attempts for t in TABLES] == [1, 1, 1, 1, 1, 1]  # c: 1 alone
    assert len(commits) == 2  # the group's one transaction, and sink.c's own commit after it
    for t in TABLES:
        assert table_ids(catalog, t) == expected[t]
        assert len(catalog.load_table(f"sink.{t}").snapshots()) == 1
    assert catalog.load_table("sink.c").properties["owner"] == "someone-else"  # the other commit stays
    coordinator.close()


def test_a_coordinator_killed_between_the_groups_fsync_and_its_swap_commits_nothing_then_all_once(
    sink_factory: SinkFactory, catalog: Any, tmp_path: Path
) -> None:
    """The group's manifests, manifest lists and metadata files are written and fsynced, the process
    dies before its pointer transaction: no table holds anything, the files are orphans, and the next
    round commits every table once."""
    sink, expected = _sink(sink_factory)
    sink.plan()
    sink.run_child("worker")
    sink.run_child("coordinator", "coordinator.before-pointer-swap=kill", expect=-signal.SIGKILL)
    for t in TABLES:
        assert table_ids(catalog, t) == []
    assert list((tmp_path / "warehouse").rglob("*.avro"))  # staged, never named

    outcomes = json.loads(sink.run_child("coordinator"))
    assert outcomes == {f"sink.{t}": "committed" for t in TABLES}
    for t in TABLES:
        assert table_ids(catalog, t) == expected[t]
        assert len(catalog.load_table(f"sink.{t}").snapshots()) == 1


def test_a_coordinator_killed_right_after_the_groups_swap_finds_every_table_of_it_committed(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """SIGKILL after the swap, before any outcome is reported: the group landed as one, and the
    restart finds each table at its floor (I4)."""
    sink, expected = _sink(sink_factory)
    sink.plan()
    sink.run_child("worker")
    sink.run_child("coordinator", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    for t in TABLES:
        assert table_ids(catalog, t) == expected[t]

    outcomes = json.loads(sink.run_child("coordinator"))
    assert outcomes == {f"sink.{t}": "already-committed" for t in TABLES}
    for t in TABLES:
        assert table_ids(catalog, t) == expected[t]
        assert len(catalog.load_table(f"sink.{t}").snapshots()) == 1
