"""Files lost between their write and their append (issue 24 item 3): a slice that stalls past orphan
cleanup's safety age writes its files again, and the coordinator never appends a file that is gone
(a snapshot naming a missing file fails every scan of the table)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory

from fanout_sink import faults
from fanout_sink.protocol import orphans, slice_writer
from fanout_sink.pyiceberg_internals.sql_catalog import current_table_uuids


def test_a_slice_that_stalls_past_half_the_orphan_age_writes_its_files_again(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="stall")
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "a"} for i in range(10)])
    removed: list[str] = []

    def stall_while_cleanup_runs(**_: Any) -> None:
        if removed:
            return  # the rewrite goes through
        time.sleep(2.5)  # a paused VM, a slow catalog: longer than cleanup's safety age
        results = orphans.clean_tables(
            catalog, {"sink.a": timedelta(seconds=1)}, lambda: orphans.pending_files(sink.channel)
        )
        removed.extend(results["sink.a"].removed)

    worker = sink.worker(file_age_limit_s=4.0)
    with faults.register("worker.after-write-files", stall_while_cleanup_runs):
        sink.batch(worker)
    worker.close()
    assert removed, "cleanup took the unannounced files of the stalled attempt"
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    assert result.tables["sink.a"].outcome == "committed" and result.tables["sink.a"].missing_files == 0
    assert table_ids(catalog, "a") == list(range(10))


def test_a_catalog_stall_after_the_write_is_caught_by_the_age_check_right_before_the_commit(
    sink_factory: SinkFactory, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 item 3. Real: broker, SQL catalog, worker, orphan cleanup, coordinator. Simulated:
    the catalog read of the worker's table re-check (its pointer query) hangs past the orphan age
    while cleanup runs."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="catstall")
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "a"} for i in range(10)])
    written: list[bool] = []
    stalled: list[bool] = []
    removed: list[str] = []

    def stalling_check(tables: dict[str, Any]) -> dict[str, str | None]:
        if written and not stalled:  # the re-check after the files were written, once
            stalled.append(True)
            time.sleep(2.5)  # longer than cleanup's safety age
            results = orphans.clean_tables(
                catalog, {"sink.a": timedelta(seconds=1)}, lambda: orphans.pending_files(sink.channel)
            )
            removed.extend(results["sink.a"].removed)
        return current_table_uuids(tables)

    monkeypatch.setattr(slice_writer, "current_table_uuids", stalling_check)
    worker = sink.worker(file_age_limit_s=4.0)
    with faults.register("worker.after-write-files", lambda **_: written.append(True)):
        sink.batch(worker)
    worker.close()
    monkeypatch.undo()
    assert removed, "cleanup took the unannounced files while the catalog hung"
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    assert result.tables["sink.a"].outcome == "committed" and result.tables["sink.a"].missing_files == 0
    assert table_ids(catalog, "a") == list(range(10))


@pytest.mark.parametrize("partitions", [1, 2], ids=["its-only-file", "one-of-two-files"])
def test_the_coordinator_never_appends_a_file_that_is_gone(
    sink_factory: SinkFactory, catalog: Any, caplog: pytest.LogCaptureFixture, partitions: int
) -> None:
    sink = sink_factory(partitions={"src": partitions}, tables="a", prefix="gone")
    for partition in range(partitions):
        values = [{"id": partition * 100 + i, "table": "a"} for i in range(5)]
        produce_json(sink.bootstrap, sink.topic, partition, values)
    sink.batch()
    pending = orphans.pending_files(sink.channel)
    assert len(pending) == partitions, "one file per partition, announced, not appended yet"
    gone = sorted(pending)[0]
    Path(gone).unlink()

    coordinator = sink.coordinator()
    with caplog.at_level(logging.ERROR, logger="fanout_sink.protocol.table_commit"):
        result = coordinator.commit_round()
    coordinator.close()
    outcome = result.tables["sink.a"]
    left = partitions - 1
    assert (outcome.outcome, outcome.files, outcome.missing_files) == (
        "committed" if left else "already-committed",
        left,
        1,
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and gone in errors[0] and "NOT appended" in errors[0]
    ids = table_ids(catalog, "a")  # the table stays readable
    if not left:
        assert ids == []
        return
    assert len(ids) == 5 and (ids == list(range(5)) or ids == list(range(100, 105)))
