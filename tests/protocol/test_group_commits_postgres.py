"""Table commits in groups on PyIceberg's SQL catalog on PostgreSQL, the scale path: test_group_commits'
tests again on the session's real PostgreSQL (a catalog of their own there, the warehouse in the test's
folder), and two sinks' groups over the same tables swapping at the same moment. PostgreSQL locks each
row an ``UPDATE`` moves until its transaction ends, so two groups that took the rows in different orders
would deadlock; :func:`~fanout_sink.pyiceberg_internals.sql_catalog.swap_pointers` takes them in name
order."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory, field_routes
from test_group_commits import (  # the same tests, collected here with this module's catalog
    test_a_coordinator_killed_between_the_groups_fsync_and_its_swap_commits_nothing_then_all_once,
    test_a_coordinator_killed_right_after_the_groups_swap_finds_every_table_of_it_committed,
    test_a_rounds_pointers_move_in_one_transaction_and_a_pointer_moved_before_it_retries_that_table_alone,
)

from fanout_sink import faults
from fanout_sink.catalog import CatalogSettings
from fanout_sink.devtools.stack.postgres import PostgresState

__all__ = [
    "test_a_coordinator_killed_between_the_groups_fsync_and_its_swap_commits_nothing_then_all_once",
    "test_a_coordinator_killed_right_after_the_groups_swap_finds_every_table_of_it_committed",
    "test_a_rounds_pointers_move_in_one_transaction_and_a_pointer_moved_before_it_retries_that_table_alone",
]


@pytest.fixture
def catalog_settings(postgres_server: PostgresState, tmp_path: Path) -> CatalogSettings:
    """A catalog of this test's own on the shared PostgreSQL (every row is keyed by its name), its
    warehouse in the test's folder as the embedded catalog's is."""
    return CatalogSettings(
        name=f"pg_{uuid.uuid4().hex[:8]}",
        type="sql",
        uri=postgres_server.sqlalchemy_uri,
        warehouse=f"file://{tmp_path / 'warehouse'}",
    )


def _waiting_on_a_row_lock(engine: Any) -> bool:
    """Whether a session of the catalog's database waits on a row lock another holds."""
    with engine.connect() as connection:
        waiting = connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'UPDATE iceberg_tables%'"
            )
        )
        return bool(waiting.scalar())


def test_two_sinks_groups_over_the_same_tables_swapping_at_once_both_land_without_a_deadlock(
    sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sinks share tables c-f (one has a, b, the other g, h); both stage their rounds on the same
    pointers; the first's transaction takes a-c, then the second's swaps and waits on a row lock.
    Taken in name order, the second holds none of d-f yet, so the first moves them and commits; the
    second then finds c-f moved and commits those alone. Taken in other orders, the two would deadlock
    (PostgreSQL then fails one transaction, and its tables are committed alone). No deadlock, every
    table exact, each sink's rows once."""
    first = sink_factory(partitions={"src": 1}, tables="abcdef", prefix="gc1")
    second = sink_factory(partitions={"src": 1}, tables="gh", prefix="gc2", overrides=field_routes("cdefgh"))
    expected: dict[str, list[int]] = {t: [] for t in "abcdefgh"}
    for sink, tables, base in ((first, "abcdef", 0), (second, "cdefgh", 100)):
        values = [{"id": base + i, "table": tables[i % 6]} for i in range(36)]
        produce_json(sink.bootstrap, sink.topic, 0, values)
        for value in values:
            expected[value["table"]].append(value["id"])
        sink.batch()
    coordinators = [first.coordinator(), second.coordinator()]
    both_staged = threading.Barrier(2, timeout=120)
    first_updates: list[str] = []
    watcher = create_engine(catalog.engine.url)

    first_holds_a_to_c = threading.Event()

    def swap_together(**_: Any) -> None:
        """Both groups staged on the same pointers, then the second swaps once the first holds a-c."""
        if threading.current_thread().name in {"first", "second"}:  # a group's swap, not a retry's
            both_staged.wait()
        if threading.current_thread().name == "second":
            first_holds_a_to_c.wait(timeout=120)

    def hold_a_to_c(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        """The first group, on its third row (c), waits until the second's waits on a row lock."""
        if threading.current_thread().name == "first" and statement.startswith("UPDATE iceberg_tables"):
            first_updates.append(statement)
            if len(first_updates) == 3:
                first_holds_a_to_c.set()
            for _attempt in range(600 if len(first_updates) == 3 else 0):
                if _waiting_on_a_row_lock(watcher):
                    break
                time.sleep(0.1)

    results: dict[str, Any] = {}

    def commit(name: str, index: int) -> None:
        results[name] = coordinators[index].commit_round()

    threads = [
        threading.Thread(target=commit, args=(n, i), name=n) for i, n in enumerate(["first", "second"])
    ]
    event.listen(catalog.engine, "after_cursor_execute", hold_a_to_c)
    with caplog.at_level(logging.WARNING), faults.register("coordinator.before-pointer-swap", swap_together):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    event.remove(catalog.engine, "after_cursor_execute", hold_a_to_c)
    watcher.dispose()
    assert not any(thread.is_alive() for thread in threads)
    assert len(first_updates) == 6
    assert not [r for r in caplog.records if "pointers failed" in r.getMessage()]  # no deadlock
    for name, tables in (("first", "abcdef"), ("second", "cdefgh")):
        assert {t: c.outcome for t, c in results[name].tables.items()} == dict.fromkeys(
            [f"sink.{t}" for t in tables], "committed"
        )
    for t in "abcdefgh":
        assert table_ids(catalog, t) == sorted(expected[t])
        assert len(catalog.load_table(f"sink.{t}").snapshots()) == (2 if t in "cdef" else 1)
    for coordinator in coordinators:
        coordinator.close()
