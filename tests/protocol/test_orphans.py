"""Orphan cleanup next to the sink, on the real broker and catalog (no Spark): the files of an aborted
worker attempt go, a file that a committed control event still waits to have appended stays whatever
its age, and so does a fresh one."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.common import create_tables, produce_json, table_ids
from support.sink_factory import SinkFactory

from fanout_sink import faults
from fanout_sink.protocol import orphans


def _data_files(catalog: Any) -> set[Path]:
    folder = Path(catalog.load_table("sink.a").location().removeprefix("file://")) / "data"
    return {p for p in folder.rglob("*") if p.is_file()}


def _age(paths: set[Path], seconds: float) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


@pytest.mark.parametrize(
    ("spelled", "normal"),
    [
        ("file:/w/t/a.parquet", "/w/t/a.parquet"),
        ("file:///w/t/a.parquet", "/w/t/a.parquet"),
        ("/w/t/a.parquet", "/w/t/a.parquet"),
        ("s3a://bucket/t/a.parquet", "s3://bucket/t/a.parquet"),
        ("S3://bucket/t/a.parquet", "s3://bucket/t/a.parquet"),
    ],
)
def test_paths_are_compared_in_one_spelling(spelled: str, normal: str) -> None:
    assert orphans.normalise(spelled) == normal


def test_an_orphan_deleted_by_another_process_since_the_listing_is_neither_removed_nor_failed(
    catalog: Any,
) -> None:
    """Two maintenance processes: the other one's expiry deleted the file between this listing and
    the delete (a warning per file and "failed to delete" figures would be noise)."""
    create_tables(catalog, "a")
    table = catalog.load_table("sink.a")
    vanished = orphans.ListedFile(f"{table.location()}/data/vanished.parquet", modified_s=0.0)
    result = orphans.remove_orphans(table, timedelta(seconds=1), set(), listed=[vanished])
    assert (result.removed, result.failed) == ((), ())


def test_aborted_attempts_go_pending_and_fresh_files_stay(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="s")
    topic = sink.topic
    coordinator = sink.coordinator()

    def deliver(fail: bool = False) -> None:
        worker = sink.worker()
        try:
            if not fail:
                sink.batch(worker)
                return

            def crash(**_: Any) -> None:
                raise RuntimeError("simulated: the attempt dies after writing its files")

            with faults.register("worker.after-write-files", crash), pytest.raises(RuntimeError):
                sink.batch(worker)
        finally:
            worker.close()

    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(10)])
    deliver()
    coordinator.commit_round()  # committed files: reachable
    committed = _data_files(catalog)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(10, 20)])
    deliver(fail=True)  # an aborted attempt: files, no committed event
    aborted = _data_files(catalog) - committed
    deliver()  # the retry delivers the same records: files announced, not appended yet
    pending = _data_files(catalog) - committed - aborted
    assert aborted and pending
    _age(committed | aborted | pending, 3 * 3600)
    fresh = next(iter(aborted)).with_name("fresh.parquet")
    fresh.write_bytes(b"written a moment ago")

    results = orphans.clean_tables(
        catalog,
        {"sink.a": timedelta(hours=1)},
        lambda: orphans.pending_files(sink.channel),
    )
    result = results["sink.a"]
    assert result.error is None
    assert {Path(orphans.normalise(p)) for p in result.removed} == aborted
    assert result.kept_pending == len(pending) and result.kept_fresh == 1
    assert all(p.exists() for p in committed | pending | {fresh}) and not any(p.exists() for p in aborted)
    assert sorted(table_ids(catalog, "a")) == list(range(10))

    coordinator.commit_round()  # the pending files land: nothing was lost
    coordinator.close()
    assert sorted(table_ids(catalog, "a")) == list(range(20))
