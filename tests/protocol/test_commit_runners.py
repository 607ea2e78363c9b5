"""Who runs a round's table commits (``protocol/commit_runners.py``): the coordinator hands the round to a
runner, and whatever the runner loses stays pending until a later commit finds each table's floor."""

from __future__ import annotations

import pickle
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from support.common import ARROW_SCHEMA, produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.catalog import load_catalog
from fanout_sink.protocol import commit_runners
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.commit_runners import RoundTables, commit_in_threads
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.table_commit import TableCommit, TableCommitter


def _pending(offset: int, files: int) -> PendingFiles:
    record = ev.DataFileRecord(
        file_path=f"f{offset}.parquet", file_format="PARQUET", spec_id=0, record_count=1, file_size_in_bytes=1
    )
    table = ev.TableRef(namespace=("n",), name=f"t{offset}", uuid="u")
    return PendingFiles(
        offset, ev.DataWritten(table=table, files=(record,) * files, topic="s", partition=0, next_offset=1)
    )


def test_a_round_split_into_shares_keeps_every_table_once_and_balances_files() -> None:
    heavy = {f"t{i}": [_pending(i, 10)] for i in range(2)}
    light = {f"u{i}": [_pending(10 + i, 1)] for i in range(20)}
    merging = frozenset({"t0"})  # tables with a commit-interval of their own: merged on executors too
    tables = RoundTables({**heavy, **light}, 100, "c", None, deadline=0.0, floors={"u": 3}, merging=merging)
    parts = tables.split(2)
    assert sorted(t for part in parts for t in part.due) == sorted(tables.due)
    files = [sum(len(p.event.files) for items in part.due.values() for p in items) for part in parts]
    assert files == [20, 20]
    kept = (100, "c", {"u": 3}, merging)
    assert all((p.round_end, p.commit_id, p.floors, p.merging) == kept for p in parts)
    assert len(tables.split(50)) == 22  # never an empty share
    shipped = pickle.loads(pickle.dumps(tables))  # to executors: as it is, with the time it has left
    assert replace(shipped, deadline=tables.deadline) == tables and shipped.remaining_s() == 0


def _sink(sink_factory: SinkFactory) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Tables a, b and c, with ids 0-29 delivered round-robin and announced on the control topic."""
    sink = sink_factory(partitions={"src": 1}, tables="abc", prefix="tc")
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "abc"[i % 3]} for i in range(30)])
    sink.batch()
    return sink, {t: [i for i in range(30) if "abc"[i % 3] == t] for t in "abc"}


class _LostAfterFirstTable:
    """A runner in another process (its own catalog, the round pickled to it, the floors it was
    given) that commits the round's first table and is lost before it reports anything."""

    def __init__(self, sink: SinkUnderTest) -> None:
        self.sink = sink
        self.committed: list[TableCommit] = []

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        shipped: RoundTables = pickle.loads(pickle.dumps(tables))
        committer = TableCommitter(self.sink.name, load_catalog(self.sink.settings))
        self.committed = list(commit_in_threads(committer, shipped.only(list(shipped.due)[:1]), 1).values())
        return {}


def test_tables_a_lost_runner_gave_no_outcome_stay_pending_and_the_next_round_commits_each_once(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink, expected = _sink(sink_factory)
    coordinator = sink.coordinator()
    driver = coordinator.table_commits
    lost = _LostAfterFirstTable(sink)
    coordinator.table_commits = lost
    first = coordinator.commit_round()
    assert [c.outcome for c in lost.committed] == ["committed"]
    assert {t: c.outcome for t, c in first.tables.items()} == dict.fromkeys(
        ["sink.a", "sink.b", "sink.c"], "failed"
    )
    assert first.low_watermark < first.round_end  # the files the round has no outcome for hold it
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == []

    coordinator.table_commits = driver
    second = coordinator.commit_round()
    outcomes = {t: c.outcome for t, c in second.tables.items()}
    assert outcomes == {"sink.a": "already-committed", "sink.b": "committed", "sink.c": "committed"}
    assert second.low_watermark == second.round_end
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]  # sorted, duplicates kept: none
    coordinator.close()


class _ExecutorWithOtherClocks:
    """A runner on another host (the round pickled to it, its own catalog) whose clocks are not the
    driver's: its wall clock runs ``skew_s`` ahead, and its monotonic clock counts from its own boot."""

    def __init__(self, sink: SinkUnderTest, monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
        self.sink = sink
        self.monkeypatch = monkeypatch
        self.clocks = SimpleNamespace(
            time=lambda: time.time() + skew_s, monotonic=lambda: time.monotonic() + 1e6, sleep=time.sleep
        )

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        shipped = pickle.dumps(tables)
        with self.monkeypatch.context() as executor:
            executor.setattr(commit_runners, "time", self.clocks)
            committer = TableCommitter(self.sink.name, load_catalog(self.sink.settings))
            return commit_in_threads(committer, pickle.loads(shipped), 2)


def test_an_executor_whose_clock_is_ahead_of_the_drivers_still_reports_its_commits(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47 item 7 (ii), shown: the round's deadline was the driver's wall-clock time, compared
    on each executor with its own clock. An executor clock ahead by more than the commit timeout gave
    every table no time at all: each was reported ``failed`` (commit timeout) while its commit went on
    and landed, round after round. The round travels with the time it has left now, counted down on
    each process's own monotonic clock."""
    sink, expected = _sink(sink_factory)
    coordinator = sink.coordinator()
    coordinator.table_commits = _ExecutorWithOtherClocks(sink, monkeypatch, skew_s=600.0)
    first = coordinator.commit_round()
    assert {t: (c.outcome, c.error) for t, c in first.tables.items()} == dict.fromkeys(
        ["sink.a", "sink.b", "sink.c"], ("committed", None)
    )
    assert first.low_watermark == first.round_end
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()


def test_a_runner_that_raises_fails_its_tables_not_the_round(sink_factory: SinkFactory, catalog: Any) -> None:
    sink, expected = _sink(sink_factory)
    coordinator = sink.coordinator()
    driver = coordinator.table_commits

    def broken(tables: RoundTables) -> dict[str, TableCommit]:
        raise RuntimeError("the cluster is gone")

    coordinator.table_commits = broken
    failed = coordinator.commit_round()
    assert {c.outcome for c in failed.tables.values()} == {"failed"}
    assert "the cluster is gone" in (failed.tables["sink.a"].error or "")
    assert set(coordinator.failing) == {"sink.a", "sink.b", "sink.c"}
    coordinator.table_commits = driver
    assert {c.outcome for c in coordinator.commit_round().tables.values()} == {"committed"}
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()


def _counting_loads(coordinator: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[TableCommitter, list[str]]:
    """The coordinator's committer, and the tables its catalog's ``load_table`` is asked for from now."""
    committer: TableCommitter = coordinator.table_commits.committer
    loads: list[str] = []
    own_load = committer.catalog.load_table
    monkeypatch.setattr(
        committer.catalog, "load_table", lambda name: loads.append(str(name)) or own_load(name)
    )
    return committer, loads


def test_a_round_reads_its_tables_pointers_at_once_and_reloads_only_a_table_moved_since(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's commits read where the SQL catalog points each table in one query and load each
    table's metadata from there, not through ``load_table`` (its ORM query was half of a load). A
    table another writer committed to after that read is no hazard: its first attempt conflicts,
    the second loads it from the catalog, and every row is there once."""
    sink, expected = _sink(sink_factory)
    coordinator = sink.coordinator()
    committer, loads = _counting_loads(coordinator, monkeypatch)
    own_locate = committer.locate

    def locate_then_another_writer(identifiers: Any) -> dict[str, str]:
        found = own_locate(identifiers)
        assert sorted(found) == ["sink.a", "sink.b", "sink.c"]
        catalog.load_table("sink.a").append(
            pa.Table.from_pylist([{"id": -1, "topic": "other"}], ARROW_SCHEMA)
        )
        loads.clear()  # the other writer's own (the fixture's catalog may be the coordinator's)
        return found

    monkeypatch.setattr(committer, "locate", locate_then_another_writer)
    result = coordinator.commit_round()
    assert {t: (c.outcome, c.attempts) for t, c in result.tables.items()} == {
        "sink.a": ("committed", 2),
        "sink.b": ("committed", 1),
        "sink.c": ("committed", 1),
    }
    assert loads == ["sink.a"], "only the table that moved since its pointer was read"
    assert table_ids(catalog, "a") == sorted([-1, *expected["a"]])
    for table in "bc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()


@pytest.mark.parametrize("pointers", ["unreadable", "metadata-gone"])
def test_pointers_that_cannot_be_used_leave_each_commit_to_load_its_table(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch, pointers: str
) -> None:
    """The round's pointer query failing, or a pointer's metadata file gone (the table dropped with
    its files since), costs each table a load from the catalog, nothing else."""
    sink, expected = _sink(sink_factory)
    coordinator = sink.coordinator()
    committer, loads = _counting_loads(coordinator, monkeypatch)

    def locate(identifiers: Any) -> dict[str, str]:
        if pointers == "unreadable":
            raise OSError("database is locked")
        return {name: f"file:///nonexistent/{name}/00001-gone.metadata.json" for name in identifiers}

    monkeypatch.setattr(committer, "locate", locate)
    result = coordinator.commit_round()
    assert {t: (c.outcome, c.attempts) for t, c in result.tables.items()} == dict.fromkeys(
        ["sink.a", "sink.b", "sink.c"], ("committed", 1)
    )
    assert sorted(loads) == ["sink.a", "sink.b", "sink.c"]
    for table in "abc":
        assert table_ids(catalog, table) == expected[table]
    coordinator.close()
