"""Control events survive an encode/decode round trip, and foreign or newer versions are refused."""

from __future__ import annotations

import struct

import pytest

from fanout_sink.errors import EventVersionError, FanoutSinkError
from fanout_sink.protocol import events as ev

TABLE = ev.TableRef(namespace=("analytics",), name="orders", uuid="5f0c4b5e-0000-4000-8000-000000000001")
FILE = ev.DataFileRecord(
    file_path="file:///w/analytics/orders/data/00000-0-abc.parquet",
    file_format="PARQUET",
    spec_id=1,
    partition=(ev.PartitionValue(field_id=1000, value=b"\x01\x00\x00\x00"), ev.PartitionValue(field_id=1001)),
    record_count=12,
    file_size_in_bytes=4096,
    column_sizes={1: 100, 2: 200},
    value_counts={1: 12, 2: 12},
    null_value_counts={1: 0, 2: 3},
    nan_value_counts={3: 1},
    lower_bounds={1: b"\x00", 2: b"a"},
    upper_bounds={1: b"\xff", 2: b"z"},
    split_offsets=(4,),
    sort_order_id=0,
)

PAYLOADS: list[ev.Payload] = [
    ev.StartCommit(commit_id="c1"),
    ev.DataWritten(
        table=TABLE,
        files=(FILE, FILE.model_copy(update={"split_offsets": None})),
        topic="o",
        partition=2,
        next_offset=17,
    ),
    ev.DataWritten(table=TABLE, files=(), topic="o", partition=0, next_offset=0),
    ev.DataWritten(
        table=TABLE,
        files=(FILE,),
        topic="o",
        partition=1,
        next_offset=30,
        key=("tenant", "id"),
        deleted_keys=(ev.KeyFile(file_path="file:///w/k.parquet", record_count=3, file_size_in_bytes=512),),
    ),
    ev.DataComplete(topic="orders", partition=3, next_offset=99, max_timestamp_ms=1_700_000_000_000),
    ev.DataComplete(topic="orders", partition=3, next_offset=99),
    ev.CommitToTable(commit_id="c1", table=TABLE, snapshot_id=123456789012345, vtts_ms=5),
    ev.CommitToTable(commit_id="c1", table=TABLE),
    ev.CommitComplete(commit_id="c1", vtts_ms=7),
    ev.DataComplete(topic="o", partition=0, next_offset=9, min_timestamp_ms=3, max_timestamp_ms=8),
    ev.CommitComplete(
        commit_id="c1",
        vtts_ms=7,
        partition_times=(ev.PartitionTime(topic="o", partition=0, max_timestamp_ms=8, max_disorder_ms=2),),
        reports_below=42,
    ),
    ev.CommitComplete(commit_id="c1"),
    ev.DataComplete(topic="o", partition=0, next_offset=9, topic_id="AAAAAAAAAAAAAAAAAAAAAQ"),
    ev.CommitComplete(commit_id="c1", delivered={"o:0": 9}, topic_ids={"o": "AAAAAAAAAAAAAAAAAAAAAQ"}),
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.type)
def test_every_event_type_round_trips(payload: ev.Payload) -> None:
    event = ev.Event(sink="shop", payload=payload)
    data = ev.encode(event)
    assert data.startswith(ev.MAGIC)
    assert ev.decode(data) == event


def test_union_branches_with_equal_shapes_are_not_confused() -> None:
    # StartCommit and CommitComplete(vtts=None) differ only by name: the branch name must decide.
    for payload in (ev.StartCommit(commit_id="x"), ev.CommitComplete(commit_id="x")):
        assert type(ev.decode(ev.encode(ev.Event(sink="s", payload=payload))).payload) is type(payload)


def test_newer_version_is_rejected_not_misread() -> None:
    data = ev.encode(ev.Event(sink="shop", payload=ev.StartCommit(commit_id="c")))
    newer = ev.MAGIC + struct.pack(">H", ev.VERSION + 1) + data[6:]
    with pytest.raises(EventVersionError, match=rf"version {ev.VERSION + 1} is not supported.*Upgrade"):
        ev.decode(newer)


def test_foreign_message_is_rejected() -> None:
    with pytest.raises(EventVersionError, match="not written by fanout_sink"):
        ev.decode(b'{"hello": "json"}')
    with pytest.raises(EventVersionError, match="too short"):
        ev.decode(b"FS")


def test_schemas_load_from_the_installed_package() -> None:
    schema = ev.envelope_schema()
    assert schema["name"] == "fanout_sink.events.Envelope"


def test_events_of_version_1_on_the_control_topic_stay_readable() -> None:
    """Written as release 1 wrote them (its schema, no later fields): read with the defaults."""
    import io

    import fastavro

    for payload in (
        ev.DataComplete(topic="o", partition=1, next_offset=5, max_timestamp_ms=8),
        ev.CommitComplete(commit_id="c1", vtts_ms=7),
    ):
        event = ev.Event(sink="s", payload=payload)
        out = io.BytesIO()
        out.write(ev.MAGIC + struct.pack(">H", 1))
        avro = payload.model_dump(exclude={"type", "min_timestamp_ms", "partition_times", "reports_below"})
        record = {"sink": "s", "event_id": event.event_id, "event_time_ms": event.event_time_ms}
        record["payload"] = (f"fanout_sink.events.{payload.type}", avro)
        fastavro.schemaless_writer(out, ev.envelope_schema(1), record)
        assert ev.decode(out.getvalue()) == event


def test_data_written_of_version_2_reads_as_an_append() -> None:
    """A version-2 ``DataWritten`` (no key, no deleted keys) is an append after the upgrade."""
    import io

    import fastavro

    payload = ev.DataWritten(table=TABLE, files=(), topic="o", partition=2, next_offset=17)
    event = ev.Event(sink="s", payload=payload)
    avro = payload.model_dump(exclude={"type", "key", "deleted_keys"})
    out = io.BytesIO()
    out.write(ev.MAGIC + struct.pack(">H", 2))
    record = {"sink": "s", "event_id": event.event_id, "event_time_ms": event.event_time_ms}
    record["payload"] = ("fanout_sink.events.DataWritten", avro)
    fastavro.schemaless_writer(out, ev.envelope_schema(2), record)
    decoded = ev.decode(out.getvalue()).payload
    assert isinstance(decoded, ev.DataWritten)
    assert decoded == payload and decoded.key == () and decoded.deleted_keys == ()


def test_positions_of_version_3_read_without_a_topic_id() -> None:
    """A version-3 ``DataComplete`` and ``CommitComplete`` (no topic id) read with none: their
    positions join whatever generation of the topic is held."""
    import io

    import fastavro

    for payload in (
        ev.DataComplete(topic="o", partition=1, next_offset=5, max_timestamp_ms=8),
        ev.CommitComplete(commit_id="c1", reports_below=3, delivered={"o:1": 5}),
    ):
        event = ev.Event(sink="s", payload=payload)
        out = io.BytesIO()
        out.write(ev.MAGIC + struct.pack(">H", 3))
        avro = payload.model_dump(exclude={"type", "topic_id", "topic_ids"})
        if isinstance(payload, ev.CommitComplete):
            avro["partition_times"] = []
        record = {"sink": "s", "event_id": event.event_id, "event_time_ms": event.event_time_ms}
        record["payload"] = (f"fanout_sink.events.{payload.type}", avro)
        fastavro.schemaless_writer(out, ev.envelope_schema(3), record)
        assert ev.decode(out.getvalue()) == event


def test_a_position_under_a_new_topic_id_drops_the_old_generations_positions() -> None:
    """Topic ``o`` recreated: the new id's first report drops every partition of the old id (the new
    topic's offsets start over), another topic keeps its positions, and an id-less (pre-version 4)
    report joins the generation held."""
    held = ev.DeliveredPositions()
    held.take_round(
        ev.CommitComplete(commit_id="c", delivered={"o:0": 9, "o:1": 4, "p:0": 2}, topic_ids={"o": "A"})
    )
    held.take_report(ev.DataComplete(topic="o", partition=1, next_offset=6))
    assert held.offsets == {("o", 0): 9, ("o", 1): 6, ("p", 0): 2} and held.recorded_id("o") == "A"

    held.take_report(ev.DataComplete(topic="o", partition=0, next_offset=3, topic_id="B"))

    assert held.offsets == {("o", 0): 3, ("p", 0): 2} and held.recorded_id("o") == "B"
    assert held.round_fields() == {"delivered": {"o:0": 3, "p:0": 2}, "topic_ids": {"o": "B"}}


def test_a_round_too_large_for_one_message_is_split_into_parts_that_add_up() -> None:
    """``split_round``: every part fits the budget, carries the round's scalars, and the parts'
    partitions add up to the round's; a round that fits stays one event."""
    positions = {("orders", p): 1000 + p for p in range(200)}
    times = tuple(ev.PartitionTime(topic="orders", partition=p, max_timestamp_ms=p) for p in range(200))
    complete = ev.CommitComplete(
        commit_id="c",
        vtts_ms=5,
        partition_times=times,
        reports_below=77,
        low_watermark=70,
        delivered=ev.delivered_map(positions),
        topic_ids={"orders": "AAAAAAAAAAAAAAAAAAAAAQ"},
    )
    whole = len(ev.encode(ev.Event(sink="s", payload=complete)))
    assert ev.split_round(complete, "s", whole) == [complete]

    parts = ev.split_round(complete, "s", 1500)

    assert len(parts) > 1 and [p.part for p in parts] == list(range(len(parts)))
    assert all(len(ev.encode(ev.Event(sink="s", payload=p))) <= 1500 for p in parts)
    assert {(p.commit_id, p.reports_below, p.low_watermark, p.vtts_ms, p.parts) for p in parts} == {
        ("c", 77, 70, 5, len(parts))
    }
    held = ev.DeliveredPositions()
    for part in parts:
        held.take_round(part)
    assert held.offsets == positions and held.recorded_id("orders") == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert sorted((t.partition, t.max_timestamp_ms) for p in parts for t in p.partition_times) == [
        (t.partition, t.max_timestamp_ms) for t in times
    ]
    with pytest.raises(FanoutSinkError, match=r"max\.message\.bytes"):
        ev.split_round(complete, "s", 100)
