"""Control events sized against what the control topic accepts (issue 24 item 2).

A slice of a wide partitioned table writes many files; each file's record carries its column
statistics, so a ``DataWritten`` of 100 files can outgrow the topic's ``max.message.bytes``. The
broker then refuses the produce on every attempt and the partition never moves again. Events are
split by encoded size, and a single file whose record alone is too large loses its column bounds.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType
from support.common import produce_json, read_slice, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.protocol import channel, recovery
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.slices import Slice
from fanout_sink.transform.records import RoutedSlice, TableRows

COLUMNS = 60
PARTITIONS = 40
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "part", LongType(), required=False),
    *(NestedField(3 + i, f"text_{i:02d}", StringType(), required=False) for i in range(COLUMNS)),
)


def _wide_sink(sink_factory: SinkFactory, max_message_bytes: int) -> tuple[SinkUnderTest, Any]:
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="wide")
    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    topic = NewTopic(sink.control_topic, 1, 1, config={"max.message.bytes": str(max_message_bytes)})
    admin.create_topics([topic])[sink.control_topic].result(30)
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="part")
    )
    table = sink.catalog.create_table("sink.wide", schema=SCHEMA, partition_spec=spec)
    return sink, table


def _rows(count: int) -> pa.Table:
    columns: dict[str, Any] = {"id": list(range(count)), "part": [i % PARTITIONS for i in range(count)]}
    for c in range(COLUMNS):
        columns[f"text_{c:02d}"] = [f"{c:02d}-{'x' * 30}-{i:06d}" for i in range(count)]
    return pa.Table.from_pydict(columns, schema=SCHEMA.as_arrow())


def _deliver(sink: SinkUnderTest, count: int) -> int:
    """One slice of ``count`` records routed to the wide table (40 partitions: 40 files)."""
    produce_json(sink.bootstrap, sink.topic, 0, [{"id": i} for i in range(count)])
    raw = read_slice(sink.bootstrap, sink.topic, 0, 0, count)

    def process(raw: pa.Table) -> RoutedSlice:
        routed = RoutedSlice()
        routed.tables["sink.wide"] = TableRows(sink.catalog.load_table("sink.wide"), _rows(raw.num_rows))
        return routed

    worker = sink.worker()
    try:
        result = worker.commit_slice(Slice(sink.topic, 0, 0, count), raw, process)
    finally:
        worker.close()
    assert result.transaction_committed and result.files == {"sink.wide": PARTITIONS}
    events = _data_written(sink)
    assert sum(len(e.files) for e in events) == PARTITIONS
    return len(events)


def _data_written(sink: SinkUnderTest) -> list[Any]:
    reader = channel.ControlReader(sink.channel)
    try:
        reader.seek(0)
        return [
            item.event.payload
            for item in reader.read_until(reader.end_offset())
            if type(item.event.payload).__name__ == "DataWritten"
        ]
    finally:
        reader.close()


def test_a_slice_whose_files_outgrow_one_message_is_announced_in_several(
    sink_factory: SinkFactory,
) -> None:
    sink, table = _wide_sink(sink_factory, max_message_bytes=60_000)
    assert _deliver(sink, 400) > 1, "40 wide files do not fit one 60 kB message"
    result = sink.coordinator().commit_round()
    assert result.tables["sink.wide"].outcome == "committed"
    assert result.tables["sink.wide"].files == PARTITIONS
    assert sorted(table.refresh().scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()) == list(
        range(400)
    )


@pytest.mark.parametrize("limit", [2_500])
def test_a_file_whose_record_alone_is_too_large_travels_without_its_column_bounds(
    sink_factory: SinkFactory, limit: int
) -> None:
    sink, table = _wide_sink(sink_factory, max_message_bytes=limit)
    assert _deliver(sink, 80) > 1, "each record cut to fit, several events"
    assert all(not f.lower_bounds and not f.upper_bounds for e in _data_written(sink) for f in e.files)
    result = sink.coordinator().commit_round()
    assert result.tables["sink.wide"].outcome == "committed"
    assert sorted(table.refresh().scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()) == list(
        range(80)
    )


SOURCE_PARTITIONS = 48


def test_a_round_over_many_source_partitions_splits_its_commit_complete(sink_factory: SinkFactory) -> None:
    """A ``CommitComplete`` carries a delivered position and a time per source partition (about 60
    bytes each), so enough partitions outgrow the control topic's ``max.message.bytes`` and the round
    failed after its tables committed, on every round. It goes out in parts in the round's
    transaction; recovery and a restarted coordinator read every part back."""
    sink = sink_factory(partitions={"src": SOURCE_PARTITIONS}, tables="a", prefix="many")
    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    topic = NewTopic(sink.control_topic, 1, 1, config={"max.message.bytes": "1500"})
    admin.create_topics([topic])[sink.control_topic].result(30)
    for partition in range(SOURCE_PARTITIONS):
        produce_json(sink.bootstrap, sink.topic, partition, [{"id": partition, "table": "a"}])
    sink.batch()

    coordinator = sink.coordinator()
    coordinator.poll_once()
    result = coordinator.commit_round()
    coordinator.close()

    assert result.tables["sink.a"].outcome == "committed"
    assert table_ids(sink.catalog, "a") == list(range(SOURCE_PARTITIONS))
    expected = {(sink.topic, p): 1 for p in range(SOURCE_PARTITIONS)}
    reader = channel.ControlReader(sink.channel)
    try:
        reader.seek(0)
        parts = [
            item.event.payload
            for item in reader.read_until(reader.end_offset())
            if isinstance(item.event.payload, ev.CommitComplete)
        ]
    finally:
        reader.close()
    assert len(parts) > 1 and {p.parts for p in parts} == {len(parts)}
    assert sorted(p.part for p in parts) == list(range(len(parts)))
    found, complete = recovery.control_topic_positions(sink.channel)
    assert found.offsets == expected and complete
    restarted = sink.coordinator()
    try:
        restarted.poll_once()
        assert restarted.state.delivered.offsets == expected
        assert set(restarted.state.times) == set(expected)
    finally:
        restarted.close()
