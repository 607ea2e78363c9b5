"""A slice larger than the worker's chunk (``spark.max-records-per-batch``), through the real broker,
catalog, reader and processor: the same rows as a whole slice, append tables' files rolled by their
target size (not one per chunk), and a change table's key changed in two chunks ending in its later
change (issue 26, item 1)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from support.common import ARROW_SCHEMA, make_processor, produce_json
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol import channel
from fanout_sink.protocol.rolling_files import target_file_bytes
from fanout_sink.protocol.slices import Slice
from fanout_sink.transform.processor import build_processor

RECORDS = 3_000
CHUNK = 500


def _counting(reader: RangeReader, topic: str, chunk: int, sizes: list[int]) -> Any:
    """A slice source reading ``topic``[0] in chunks, noting each chunk's size."""

    def read(first: int, until: int) -> Any:
        for table in reader.read_chunks(topic, 0, first, until, max_records=chunk):
            sizes.append(table.num_rows)
            yield table

    return read


def test_a_slice_larger_than_the_chunk_writes_the_same_rows_and_rolls_files_by_size(
    sink_factory: SinkFactory,
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="chunk")
    channel.ensure_control_topic(sink.channel)
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(RECORDS)])
    # Table a rolls a file every ~300 rows' worth of Arrow bytes; b keeps PyIceberg's default (512 MB).
    rows_per_file = 300
    per_row = pa.Table.from_pylist([{"id": 0, "topic": sink.topic}], schema=ARROW_SCHEMA).nbytes
    a = sink.catalog.load_table("sink.a")
    with a.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": str(per_row * rows_per_file)})
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    sizes: list[int] = []
    worker = sink.worker(chunk_records=CHUNK)
    coordinator = sink.coordinator()

    result = worker.commit_slice(
        Slice(sink.topic, 0, 0, RECORDS),
        _counting(reader, sink.topic, CHUNK, sizes),
        make_processor(sink.catalog),
    )
    assert result.transaction_committed and result.records_in == RECORDS
    assert sizes == [CHUNK] * (RECORDS // CHUNK), "the reader handed the slice out in chunks"
    assert result.rows == {"sink.a": RECORDS // 2, "sink.b": RECORDS // 2}
    assert result.files["sink.b"] == 1, "b's rows of 6 chunks roll into one file below its target size"
    coordinator.commit_round()

    for name, parity in (("sink.a", 0), ("sink.b", 1)):
        table = sink.catalog.load_table(name)
        ids = sorted(table.scan().to_arrow()["id"].to_pylist())
        assert ids == list(range(parity, RECORDS, 2)), f"{name}: every row once"
    files = [task.file for task in sink.catalog.load_table("sink.a").scan().plan_files()]
    counts = sorted((f.record_count for f in files), reverse=True)
    assert result.files["sink.a"] == len(files) >= (RECORDS // 2) // rows_per_file
    assert len(files) != RECORDS // CHUNK, "files follow a's target size, not the chunks"
    target = target_file_bytes(sink.catalog.load_table("sink.a"))
    # Every file but the slice's last holds one target's worth of rows (estimated from Arrow bytes).
    full = counts[: len(files) - 1]
    assert full and all(abs(c - full[0]) <= full[0] // 10 for c in full), counts
    assert full[0] * per_row <= target * 1.5, (counts, target)
    reader.close()
    worker.close()
    coordinator.close()


def _route(table: str) -> dict[str, Any]:
    return {
        "when": f"table == '{table}'",
        "select": "{id: id, v: v}",
        "changes": {"format": "upsert", "key": ["id"], "delete-when": "op == 'd'"},
    }


def test_a_key_changed_in_two_chunks_of_one_slice_ends_in_its_later_change(sink_factory: SinkFactory) -> None:
    sink = sink_factory(
        partitions={"src": 1}, prefix="chunkchg", overrides={"tables": {"sink.a": _route("a")}}
    )
    process = build_processor(sink.config, sink.catalog)
    coordinator = sink.coordinator()
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    worker = sink.worker(chunk_records=3)

    def change(key: int, value: int | None) -> dict[str, Any]:
        return {"table": "a", "id": key, "v": value, "op": "d" if value is None else "u"}

    # Live before the slice: 5 and 6.
    produce_json(sink.bootstrap, sink.topic, 0, [change(5, 50), change(6, 60)])
    read = functools.partial(reader.read_chunks, sink.topic, 0, max_records=3)
    assert worker.commit_slice(Slice(sink.topic, 0, 0, 2), read, process).transaction_committed
    coordinator.commit_round()
    # One slice of three chunks of three changes each.
    produce_json(
        sink.bootstrap,
        sink.topic,
        0,
        [
            *(change(1, 10), change(2, 20), change(5, None)),
            *(change(1, None), change(2, 21), change(3, 30)),
            *(change(1, 12), change(3, None), change(5, 55)),
        ],
    )
    sizes: list[int] = []
    result = worker.commit_slice(
        Slice(sink.topic, 0, 2, 11), _counting(reader, sink.topic, 3, sizes), process
    )
    assert result.transaction_committed and sizes == [3, 3, 3]
    assert result.files["sink.a"] == 3, "a change table's chunks are written one by one"
    coordinator.commit_round()

    rows = sink.catalog.load_table("sink.a").scan().to_arrow().to_pylist()
    keys = [r["id"] for r in rows]
    assert len(keys) == len(set(keys)), f"a key twice: {sorted(keys)}"
    # 1: upsert, delete, upsert -> 12; 2: 21; 3: inserted then deleted; 5: deleted then back; 6 untouched.
    assert {r["id"]: r["v"] for r in rows} == {1: 12, 2: 21, 5: 55, 6: 60}
    reader.close()
    worker.close()
    coordinator.close()


def test_an_append_table_recreated_between_two_chunks_keeps_each_value_in_its_column(
    sink_factory: SinkFactory,
) -> None:
    """Issue 33 item 1. Real: broker, SQL catalog, reader, the sink's processor (its table cache
    expiring at once, so each chunk loads the table anew), worker, coordinator; ``sink.a`` dropped and
    recreated as ``(id, note, topic)`` between the slice's two chunks. Chunk 1's file holds field id 2
    as ``topic``; announced under the new uuid it would read back as ``note``."""
    sink = sink_factory(
        partitions={"src": 1},
        prefix="chunkre",
        overrides={"tables": {"sink.a": {"select": "{id: id, topic: topic}"}}, "dynamic": None},
    )
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i, "topic": f"t{i}"} for i in range(4)])
    process = build_processor(sink.config, sink.catalog)
    process.tables.max_age_seconds = 0.0
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    recreated = Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "note", StringType()),
        NestedField(3, "topic", StringType()),
    )

    read = _recreating_between_chunks(sink, reader, recreated)
    worker = sink.worker(chunk_records=2)
    coordinator = sink.coordinator()
    assert worker.commit_slice(Slice(sink.topic, 0, 0, 4), read, process).transaction_committed
    outcome = coordinator.commit_round().tables["sink.a"]
    rows = sink.catalog.load_table("sink.a").scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["note"], r["topic"]) for r in rows) == [(i, None, f"t{i}") for i in range(4)]
    assert (outcome.outcome, outcome.stale_files) == ("committed", 1), "chunk 1's file, rewritten by name"
    reader.close()
    worker.close()
    coordinator.close()


def test_a_change_table_recreated_between_two_chunks_ends_in_each_keys_last_change(
    sink_factory: SinkFactory,
) -> None:
    """Issue 33 item 1 for change tables. Each chunk goes out under its own table's uuid already, but
    the coordinator rewrote chunk 1's files (for the dropped table) as plain appends: key 2 twice,
    and key 1, deleted in chunk 2, live. Real: as the append test above."""
    sink = sink_factory(partitions={"src": 1}, prefix="chgre", overrides={"tables": {"sink.a": _route("a")}})
    process = build_processor(sink.config, sink.catalog)
    process.tables.max_age_seconds = 0.0
    reader = RangeReader(sink.channel.clients, sink.channel.sink_group)
    produce_json(
        sink.bootstrap,
        sink.topic,
        0,
        [
            {"table": "a", "id": 1, "v": 10, "op": "u"},
            {"table": "a", "id": 2, "v": 20, "op": "u"},
            {"table": "a", "id": 1, "v": None, "op": "d"},
            {"table": "a", "id": 2, "v": 21, "op": "u"},
        ],
    )
    recreated = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "note", StringType()),
        NestedField(3, "v", LongType()),
        identifier_field_ids=[1],
    )

    read = _recreating_between_chunks(sink, reader, recreated)
    worker = sink.worker(chunk_records=2)
    coordinator = sink.coordinator()
    assert worker.commit_slice(Slice(sink.topic, 0, 0, 4), read, process).transaction_committed
    outcome = coordinator.commit_round().tables["sink.a"]
    rows = sink.catalog.load_table("sink.a").scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["note"], r["v"]) for r in rows) == [(2, None, 21)]
    assert (outcome.stale_files, outcome.deleted) == (1, 0), "chunk 1's file rewritten, key 1's row never in"
    reader.close()
    worker.close()
    coordinator.close()


def _recreating_between_chunks(
    sink: SinkUnderTest, reader: RangeReader, recreated: Schema
) -> Callable[[int, int], Iterator[pa.Table]]:
    """A slice source reading two records a chunk that drops ``sink.a`` and creates it again as
    ``recreated`` before it hands out the second chunk."""

    def read(first: int, until: int) -> Iterator[pa.Table]:
        for n, chunk in enumerate(reader.read_chunks(sink.topic, 0, first, until, max_records=2)):
            if n == 1:
                sink.catalog.drop_table("sink.a")
                sink.catalog.create_table("sink.a", schema=recreated)
            yield chunk

    return read
