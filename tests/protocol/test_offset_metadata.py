"""The offset metadata the sink commits (``protocol/offset_metadata.py``): each payload's exact wire
string pinned, since sinks of other versions read it back (a layout change, a restart after a long
downtime), and the forms committed before a payload existed decoded."""

from __future__ import annotations

import pytest

from fanout_sink.protocol.offset_metadata import DeliveredBy, LayoutRecord, RoundMark
from fanout_sink.protocol.partition_groups import PartitionGroups


def test_the_sink_groups_offsets_name_the_transactional_id_that_delivered_them() -> None:
    packed = DeliveredBy("fanout-sink:orders:groups:8:3")
    assert packed.encode() == "fanout-sink:orders:groups:8:3"
    assert DeliveredBy.decode("fanout-sink:orders:groups:8:3") == packed
    assert DeliveredBy.decode("fanout-sink:orders:events:0") == DeliveredBy("fanout-sink:orders:events:0")


@pytest.mark.parametrize("old", ["", None])
def test_a_sink_group_offset_without_a_name_was_delivered_under_the_partitions_own_id(
    old: str | None,
) -> None:
    """Sinks before packing committed no name: the reader falls back to the partition's own id."""
    assert DeliveredBy.decode(old) is None


def test_the_layout_record_is_the_partition_group_count_under_its_key() -> None:
    assert LayoutRecord(PartitionGroups(8)).encode() == '{"partition-groups": 8}'
    assert LayoutRecord(PartitionGroups(None)).encode() == '{"partition-groups": null}'
    assert LayoutRecord.decode('{"partition-groups": 8}') == LayoutRecord(PartitionGroups(8))
    assert LayoutRecord.decode('{"partition-groups": null}') == LayoutRecord(PartitionGroups(None))
    assert LayoutRecord.decode("") is None
    assert LayoutRecord.decode(None) is None


def test_the_layout_record_names_its_start_and_the_layouts_it_has_yet_to_fence() -> None:
    """Issue 47 item 1: workers compare the start; the next start fences what this one could not."""
    record = LayoutRecord(
        PartitionGroups(3), "20261207T120000Z-ab12", (PartitionGroups(2), PartitionGroups())
    )
    encoded = '{"partition-groups": 3, "start": "20261207T120000Z-ab12", "unfenced": [2, null]}'
    assert record.encode() == encoded
    assert LayoutRecord.decode(encoded) == record


def test_the_round_mark_is_compact_json_of_the_round_end_and_the_log_end() -> None:
    mark = RoundMark.of_round(100, 3)
    assert mark.encode() == '{"round_end":100,"log_end":104}'
    assert RoundMark.decode('{"round_end":100,"log_end":104}') == RoundMark(100, 104)
    assert mark.moved_to(120).encode() == '{"round_end":120,"log_end":104}'


@pytest.mark.parametrize("old", ["", None, "not json", '{"round_end": 5}', "[1, 2]"])
def test_a_low_watermark_committed_without_a_mark_has_none(old: str | None) -> None:
    """Coordinators before the mark committed the low watermark with no metadata: nothing is proven."""
    assert RoundMark.decode(old) is None
