"""Tables changed by others between the sink's writes and commits: snapshot expiry, spec changes,
drop and recreate. Real broker, real SQLite catalog, real Iceberg metadata changes; only the crash
points are simulated (fault-point callbacks that raise)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import NestedField, StringType
from support.common import (
    ARROW_SCHEMA,
    NAMESPACE,
    TABLE_SCHEMA,
    make_processor,
    produce_json,
    run_batch,
    table_ids,
)
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults, status
from fanout_sink.protocol import orphans, table_state
from fanout_sink.protocol.quarantine import quarantine_path
from fanout_sink.transform.processor import build_processor
from fanout_sink.transform.records import TableRows


class _Crash(Exception):
    """Stands in for the coordinator process dying at a fault point."""


def _crash(**_: Any) -> None:
    raise _Crash("simulated coordinator death")


def test_floor_survives_expiry_of_the_sinks_snapshots(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Scenario 5. Real: broker, catalog, another writer's append, ``expire_snapshots`` of PyIceberg.
    Simulated: the coordinator dies after its table commit and before it moves its low watermark
    (a raising fault-point callback), so the next coordinator re-reads the same control events."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="s")
    name, topic = sink.name, sink.topic
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(5)])
    worker = sink.worker()
    run_batch(worker, bootstrap_servers, {topic: 1}, make_processor(catalog))
    worker.close()

    first = sink.coordinator()
    with faults.register("coordinator.before-complete", _crash), pytest.raises(_Crash):
        first.commit_round()  # table committed, low watermark still 0
    first.close()
    assert table_ids(catalog, "a") == list(range(5))

    table = catalog.load_table(f"{NAMESPACE}.a")
    table.append(pa.Table.from_pylist([{"id": -1, "topic": "other"}], ARROW_SCHEMA))  # another writer
    table = catalog.load_table(f"{NAMESPACE}.a")
    table.maintenance.expire_snapshots().older_than(dt.datetime.now(dt.UTC)).commit()
    table = catalog.load_table(f"{NAMESPACE}.a")
    assert len(table.snapshots()) == 1, "only the other writer's snapshot is left"

    second = sink.coordinator()  # re-reads from control offset 0
    result = second.commit_round()
    second.close()
    assert result.tables[f"{NAMESPACE}.a"].outcome == "already-committed"
    assert table_ids(catalog, "a") == [-1, *range(5)]
    assert table_state.read_state(catalog.load_table(f"{NAMESPACE}.a"), name).next_control_offset() > 0


def test_files_written_before_a_partition_spec_change_are_committed_under_their_own_spec(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Scenario 6, first half. Real: broker, catalog, ``update_spec`` committed between the worker's
    write and the coordinator's commit, and PyIceberg scans (no Spark) that read every row back."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="s")  # a: unpartitioned, then partitioned
    topic = sink.topic
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="id"))
    catalog.create_table(f"{NAMESPACE}.p", schema=TABLE_SCHEMA, partition_spec=spec)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "pa"[i % 2]} for i in range(6)])
    worker = sink.worker()
    run_batch(worker, bootstrap_servers, {topic: 1}, make_processor(catalog))  # written under spec 0
    for table_name in ("p", "a"):
        with catalog.load_table(f"{NAMESPACE}.{table_name}").update_spec() as update:
            update.add_identity("topic")
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    assert {t: o.outcome for t, o in result.tables.items()} == {"sink.a": "committed", "sink.p": "committed"}

    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "pa"[i % 2]} for i in range(6, 10)])
    run_batch(worker, bootstrap_servers, {topic: 1}, make_processor(catalog))  # under spec 1
    worker.close()
    assert {o.outcome for o in coordinator.commit_round().tables.values()} == {"committed"}
    coordinator.close()
    assert table_ids(catalog, "p") == [0, 2, 4, 6, 8]
    assert table_ids(catalog, "a") == [1, 3, 5, 7, 9]
    table = catalog.load_table(f"{NAMESPACE}.p")
    assert sorted(table.scan(row_filter="id == 2").to_arrow()["id"].to_pylist()) == [2]  # old-spec pruning
    assert sorted(table.scan(row_filter="id >= 6").to_arrow()["id"].to_pylist()) == [6, 8]
    specs = {
        e.data_file.spec_id
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    }
    assert specs == {0, 1}


def test_a_table_that_keeps_failing_is_reported_every_round_while_others_commit(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario 6, second half. Real: broker, catalog, and a permanently broken table (its current
    metadata file deleted, as a bad manual clean-up would). Nothing simulated."""
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="s")
    topic = sink.topic
    broken = catalog.load_table(f"{NAMESPACE}.b")  # still cached by the worker below
    Path(broken.metadata_location.removeprefix("file://")).unlink()
    coordinator = sink.coordinator()
    worker = sink.worker()
    expected: list[int] = []
    processor = make_processor(catalog)

    def route(raw: Any) -> Any:
        """Rows for table a as usual, plus one row per slice for b through the cached table."""
        routed = processor(raw)
        routed.tables["sink.b"] = TableRows(
            broken, pa.Table.from_pylist([{"id": 0, "topic": "b"}], ARROW_SCHEMA)
        )
        return routed

    caplog.set_level(logging.ERROR, logger="fanout_sink.protocol.failing_tables")
    for round_no in range(3):
        ids = list(range(round_no * 10, round_no * 10 + 3))
        produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in ids])
        expected += ids
        run_batch(worker, bootstrap_servers, {topic: 1}, route)
        result = coordinator.commit_round()
        assert result.tables["sink.a"].outcome == "committed"
        assert result.tables["sink.b"].outcome == "failed"
        assert table_ids(catalog, "a") == expected
    worker.close()
    coordinator.close()
    errors = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "sink.b" in r.getMessage()
    ]
    assert len(errors) == 3
    assert "3 round(s) in a row" in errors[-1] and "fix:" in errors[-1] and "oldest pending" in errors[-1]
    assert coordinator.failing["sink.b"].rounds == 3
    pending = status.pending_tables(catalog, sink.channel)  # what `fanout-sink status` shows
    assert [(p.table, p.file_events) for p in pending] == [("sink.b", 3)]


def test_rows_after_a_drop_and_recreate_land_in_the_new_table_while_the_old_one_is_cached(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Scenario 7, worker side. Real: broker, catalog, the sink's own processor with its
    ``TableManager`` cache (300 s), and a drop + recreate of the table between two batches."""
    sink = sink_factory(
        partitions={"src": 1},
        prefix="s",
        overrides={"tables": {"sink.a": {"select": "{id: id, topic: topic}"}}, "dynamic": None},
    )
    topic = sink.topic
    processor = build_processor(sink.config, catalog)
    worker = sink.worker()
    coordinator = sink.coordinator()
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "topic": "t"} for i in range(3)])
    run_batch(worker, bootstrap_servers, {topic: 1}, processor)  # creates and caches sink.a
    coordinator.commit_round()
    old = catalog.load_table(f"{NAMESPACE}.a")
    assert table_ids(catalog, "a") == [0, 1, 2]

    catalog.drop_table(f"{NAMESPACE}.a")
    catalog.create_table(f"{NAMESPACE}.a", schema=old.schema())
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "topic": "t"} for i in range(3, 6)])
    run_batch(worker, bootstrap_servers, {topic: 1}, processor)  # the processor still has the old table
    result = coordinator.commit_round()
    worker.close()
    coordinator.close()
    assert result.tables[f"{NAMESPACE}.a"].stale_files == 0
    assert table_ids(catalog, "a") == [3, 4, 5]


def test_files_for_a_dropped_table_that_do_not_fit_its_successor_are_named_in_an_error(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario 7, coordinator side. Real: broker, catalog, files announced for the old table, then
    a drop and a recreate with a required column the rows do not have."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="s")
    topic = sink.topic
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    worker = sink.worker()
    run_batch(worker, bootstrap_servers, {topic: 1}, make_processor(catalog))
    worker.close()
    catalog.drop_table(f"{NAMESPACE}.a")
    catalog.create_table(
        f"{NAMESPACE}.a",
        schema=Schema(*TABLE_SCHEMA.fields, NestedField(3, "region", StringType(), required=True)),
    )
    caplog.set_level(logging.ERROR, logger="fanout_sink.protocol.table_commit")
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    outcome = result.tables[f"{NAMESPACE}.a"]
    assert (outcome.outcome, outcome.refused_files) == ("refused", 1)
    assert table_ids(catalog, "a") == []
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "1 file(s) with 4 row(s)" in error and ".parquet" in error and "required column region" in error
    _assert_quarantine_outlives_cleanup(catalog, sink, error, rows=4)


def _assert_quarantine_outlives_cleanup(catalog: Any, sink: Any, error: str, rows: int) -> None:
    """Issue 24 item 5: the refused files' copies, named in the ERROR, survive orphan cleanup of the
    table that has the same location (the originals are orphans there and go)."""
    copies = [
        w.rstrip(",")
        for w in error.split()
        if "_fanout_sink_quarantine" in w and w.rstrip(",").endswith(".parquet")
    ]
    assert copies, error
    old = time.time() - 3600
    for path in Path(catalog.load_table(f"{NAMESPACE}.a").location().removeprefix("file://")).rglob(
        "*.parquet"
    ):
        os.utime(path, (old, old))
    orphans.clean_tables(
        catalog, {f"{NAMESPACE}.a": timedelta(seconds=1)}, lambda: orphans.pending_files(sink.channel)
    )
    kept = [Path(c.removeprefix("file://")) for c in copies]
    assert all(p.exists() for p in kept)
    assert sum(pq.read_metadata(p).num_rows for p in kept) == rows


def _write_three_rows_then_drop_the_table(sink: SinkUnderTest, bootstrap_servers: str, catalog: Any) -> None:
    """Ids 0-2 delivered for table ``a`` (files written, events committed), then the table dropped."""
    produce_json(bootstrap_servers, sink.topic, 0, [{"id": i, "table": "a"} for i in range(3)])
    worker = sink.worker()
    run_batch(worker, bootstrap_servers, {sink.topic: 1}, make_processor(catalog))
    worker.close()
    catalog.drop_table(f"{NAMESPACE}.a")


def test_files_for_a_table_that_is_gone_are_kept_where_cleanup_cannot_take_them(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="s")
    _write_three_rows_then_drop_the_table(sink, bootstrap_servers, catalog)
    caplog.set_level(logging.ERROR, logger="fanout_sink.protocol.table_commit")
    coordinator = sink.coordinator()
    outcome = coordinator.commit_round().tables[f"{NAMESPACE}.a"]
    coordinator.close()
    assert (outcome.outcome, outcome.refused_files) == ("table-missing", 1)
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    catalog.create_table(f"{NAMESPACE}.a", schema=TABLE_SCHEMA)  # recreated at the same location
    _assert_quarantine_outlives_cleanup(catalog, sink, error, rows=3)


def test_a_quarantine_copy_that_fails_keeps_the_files_pending_until_it_succeeds(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Issue 33 item 4. Real: broker, SQL catalog, worker, coordinator, a file in the way of the
    quarantine folder (the copy fails with an OSError)."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="qfail")
    _write_three_rows_then_drop_the_table(sink, bootstrap_servers, catalog)
    pending = orphans.pending_files(sink.channel)
    blocker = Path(quarantine_path(sorted(pending)[0], sink.channel.sink).split("://")[-1]).parents[2]
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("in the way")
    coordinator = sink.coordinator()
    outcome = coordinator.commit_round().tables[f"{NAMESPACE}.a"]
    assert outcome.outcome == "failed" and "quarantine" in (outcome.error or "")
    assert orphans.pending_files(sink.channel) == pending, "the only copies stay pending"
    blocker.unlink()
    outcome = coordinator.commit_round().tables[f"{NAMESPACE}.a"]
    coordinator.close()
    assert (outcome.outcome, outcome.refused_files) == ("table-missing", 1)


def test_rows_an_old_table_already_holds_are_not_rewritten_into_its_successor_after_a_restart(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Scenario 7 across a coordinator restart. Real: broker, catalog, a table swap (the old table
    renamed aside, a new one created under the name), a new coordinator re-reading from the low
    watermark. Simulated: table b's commit fails through a fault-point callback, which holds the low
    watermark below events table a already committed."""
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="s")
    topic = sink.topic
    worker = sink.worker()
    processor = make_processor(catalog)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "b"} for i in range(2)])
    run_batch(worker, bootstrap_servers, {topic: 1}, processor)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(10, 13)])
    run_batch(worker, bootstrap_servers, {topic: 1}, processor)
    worker.close()

    def fail_b(table: str, **_: Any) -> None:
        if table == f"{NAMESPACE}.b":
            raise _Crash("catalog refuses table b")

    first = sink.coordinator()
    with faults.register("coordinator.before-table-commit", fail_b):
        result = first.commit_round()
    first.close()
    assert result.tables[f"{NAMESPACE}.a"].outcome == "committed"
    assert result.tables[f"{NAMESPACE}.b"].outcome == "failed"

    old = catalog.load_table(f"{NAMESPACE}.a")
    catalog.rename_table(f"{NAMESPACE}.a", f"{NAMESPACE}.a_old")
    catalog.create_table(f"{NAMESPACE}.a", schema=old.schema())

    second = sink.coordinator()  # re-reads from b's pending event
    result = second.commit_round()
    second.close()
    assert result.tables[f"{NAMESPACE}.b"].outcome == "committed"
    assert table_ids(catalog, "a_old") == [10, 11, 12]
    assert table_ids(catalog, "a") == [], "rows the old table holds were appended to its successor too"


def test_a_table_recreated_while_the_round_looks_for_it_gets_its_files(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """Drop-then-create leaves a moment with no table; a round that meets it waits for the new one
    instead of quarantining its rows (the chaos run's table-recreate met it once)."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="w")
    _write_three_rows_then_drop_the_table(sink, bootstrap_servers, catalog)
    recreate = threading.Timer(2.0, lambda: catalog.create_table(f"{NAMESPACE}.a", schema=TABLE_SCHEMA))
    recreate.start()
    coordinator = sink.coordinator()
    try:
        outcome = coordinator.commit_round().tables[f"{NAMESPACE}.a"]
    finally:
        recreate.join()
        coordinator.close()
    assert (outcome.outcome, outcome.refused_files) == ("committed", 0), outcome
    assert sorted(table_ids(catalog, "a")) == [0, 1, 2]
