"""Round bookkeeping and VTTS, as plain rules over plain data (no broker needed)."""

from __future__ import annotations

from fanout_sink.kafka.offsets import PartitionPosition
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.channel import ControlEvent
from fanout_sink.protocol.commit_state import CommitState

REF = ev.TableRef(namespace=("n",), name="t", uuid="u")


def _written(offset: int, table: str = "t") -> ControlEvent:
    ref = REF.model_copy(update={"name": table})
    payload = ev.DataWritten(table=ref, files=(), topic="s", partition=0, next_offset=offset)
    return ControlEvent(offset, ev.Event(sink="x", payload=payload))


def _complete(offset: int, partition: int, ts: int | None) -> ControlEvent:
    payload = ev.DataComplete(topic="s", partition=partition, next_offset=offset, max_timestamp_ms=ts)
    return ControlEvent(offset, ev.Event(sink="x", payload=payload))


def test_rounds_take_only_events_below_their_end_and_the_watermark_waits_for_failed_tables() -> None:
    state = CommitState()
    for item in (_written(1, "a"), _written(2, "b"), _written(7, "a")):
        state.add(item)
    due = state.due(5)
    assert {t: [p.offset for p in items] for t, items in due.items()} == {"n.a": [1], "n.b": [2]}
    state.settle("n.a", 5)  # committed; n.b failed and stays pending
    assert state.low_watermark(5) == 2
    state.settle("n.b", 5)
    assert state.low_watermark(5) == 5
    assert [p.offset for p in state.pending["n.a"]] == [7]


def test_vtts_is_the_minimum_of_behind_partitions_and_caught_up_ones_do_not_hold_it_back() -> None:
    state = CommitState()
    for item in (_complete(1, 0, 100), _complete(2, 1, 300), _complete(3, 0, 200), _complete(9, 1, 999)):
        state.add(item)
    behind = [PartitionPosition("s", 0, 5, 10), PartitionPosition("s", 1, 5, 10)]
    assert state.vtts(behind, round_end=5) == 200  # min(max(100, 200), 300); offset 9 is next round
    caught_up = [PartitionPosition("s", 0, 5, 10), PartitionPosition("s", 1, 10, 10)]
    assert state.vtts(caught_up, round_end=5) == 200
    unreported = [*behind, PartitionPosition("s", 2, None, 4)]
    assert state.vtts(unreported, round_end=5) is None
    assert state.vtts([PartitionPosition("s", 0, 10, 10)], round_end=10) == 999  # all caught up
