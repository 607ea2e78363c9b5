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
from fanout_sink.transform.processor import build_processor


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


def test_a_change_tables_delete_files_are_kept_and_its_rows_read_the_same(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """A change table committed by the coordinator with position deletes over three rounds: every
    data and delete file of every snapshot survives cleanup (with its metadata), the stray goes,
    and the table reads the same rows."""
    route = {
        "when": "table == 'a'",
        "select": "{id: id, v: v}",
        "changes": {"format": "upsert", "key": ["id"], "delete-when": "op == 'd'"},
    }
    sink = sink_factory(partitions={"src": 1}, prefix="odel", overrides={"tables": {"sink.a": route}})
    process = build_processor(sink.config, sink.catalog)
    coordinator = sink.coordinator()
    rounds = [
        [{"table": "a", "id": i, "v": i, "op": "u"} for i in range(20)],
        [{"table": "a", "id": i, "v": -i, "op": "d" if i % 3 == 0 else "u"} for i in range(0, 20, 2)],
        [{"table": "a", "id": i, "v": 10 * i, "op": "u"} for i in range(0, 20, 5)],
    ]
    for changes in rounds:
        produce_json(bootstrap_servers, sink.topic, 0, changes)
        sink.batch(process=process)
        coordinator.commit_round()
    coordinator.close()
    table = sink.catalog.load_table("sink.a")
    live_deletes = {orphans.normalise(p) for p in table.inspect.delete_files()["file_path"].to_pylist()}
    every_file = {orphans.normalise(p) for p in table.inspect.all_files()["file_path"].to_pylist()}
    assert len(live_deletes) >= 2 and live_deletes <= every_file
    assert every_file <= orphans.reachable_files(table)
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    folder = Path(table.location().removeprefix("file://"))
    everything = {p for p in folder.rglob("*") if p.is_file()}
    _age(everything, 3 * 3600)
    stray = folder / "data" / "stray.parquet"
    stray.write_bytes(b"an aborted attempt's file")
    _age({stray}, 3 * 3600)

    result = orphans.clean_tables(
        sink.catalog, {"sink.a": timedelta(hours=1)}, lambda: orphans.pending_files(sink.channel)
    )["sink.a"]
    assert result.error is None and str(stray) in result.removed
    assert all(Path(path).exists() for path in every_file)
    table = sink.catalog.load_table("sink.a")
    assert all(Path(path).exists() for path in orphans.reachable_files(table))
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == rows
    assert {r["id"]: r["v"] for r in rows} == {
        **{i: i for i in range(20) if i % 2},
        **{i: -i for i in range(0, 20, 2) if i % 3},
        **{i: 10 * i for i in range(0, 20, 5)},
    }
