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
    # min(max(100, 200), 300) less a tie's millisecond; offset 9 is next round
    assert state.vtts(behind, round_end=5) == 199
    caught_up = [PartitionPosition("s", 0, 5, 10), PartitionPosition("s", 1, 10, 10)]
    assert state.vtts(caught_up, round_end=5) == 199
    unreported = [*behind, PartitionPosition("s", 2, None, 4)]
    assert state.vtts(unreported, round_end=5) is None
    assert state.vtts([PartitionPosition("s", 0, 10, 10)], round_end=10) == 999  # all caught up


def test_vtts_does_not_claim_a_timestamp_an_undelivered_record_can_still_carry() -> None:
    """Partition 0 is behind; its delivered records reached timestamp 200. The next record may carry
    200 too (timestamps tie), so VTTS may claim at most 199."""
    state = CommitState()
    state.add(_complete(1, 0, 200))
    assert state.vtts([PartitionPosition("s", 0, 5, 10)], round_end=5) == 199


def _slice(offset: int, partition: int, low: int, high: int) -> ControlEvent:
    payload = ev.DataComplete(
        topic="s", partition=partition, next_offset=offset, min_timestamp_ms=low, max_timestamp_ms=high
    )
    return ControlEvent(offset, ev.Event(sink="x", payload=payload))


def test_vtts_of_a_partition_with_out_of_order_timestamps_leaves_room_for_the_disorder_seen() -> None:
    """Producer-set timestamps: the second slice went back 80 ms below the first one's maximum, so an
    undelivered record may be as old as the newest delivered timestamp minus 80 ms."""
    state = CommitState()
    for item in (_slice(1, 0, 100, 200), _slice(2, 0, 120, 300), _slice(3, 1, 1000, 1000)):
        state.add(item)
    behind = [PartitionPosition("s", 0, 5, 10), PartitionPosition("s", 1, 5, 10)]
    assert state.vtts(behind, round_end=5) == 300 - 80 - 1
    state.add(_slice(6, 0, 310, 400))  # in order again: the disorder seen stays
    assert state.vtts(behind, round_end=7) == 400 - 80 - 1
    # LogAppendTime (or ordered producer timestamps): no disorder, only the tie margin.
    assert state.vtts([PartitionPosition("s", 1, 5, 10)], round_end=7) == 999


def test_a_restarted_state_takes_over_the_partition_times_of_the_last_commit_complete() -> None:
    """The reports at 1 and 2 were folded by the last round (end 5); a restarted coordinator
    re-reads from its low watermark (here 2), so it sees the report at 2 again, then the round's
    CommitComplete, then a new report. It must not fold the report at 2 twice (that would look like
    disorder) nor lose the one at 1."""
    before = CommitState()
    for item in (_slice(1, 0, 100, 200), _slice(2, 0, 190, 300)):
        before.add(item)
    behind = [PartitionPosition("s", 0, 5, 10)]
    assert before.vtts(behind, round_end=5) == 300 - 10 - 1
    times, reports_below = before.checkpoint(5)
    complete = ev.CommitComplete(commit_id="c", partition_times=times, reports_below=reports_below)

    after = CommitState()
    for item in (_slice(2, 0, 190, 300), ControlEvent(6, ev.Event(sink="x", payload=complete))):
        after.add(item)
    assert after.vtts(behind, round_end=7) == 289
    after.add(_slice(8, 0, 280, 400))  # a step back of 20 below 300
    assert after.vtts(behind, round_end=9) == 400 - 20 - 1


def test_a_round_end_between_a_transactions_files_and_its_report_cuts_a_transaction() -> None:
    """A worker transaction's files are read below the end, its ``DataComplete`` above it (another
    transaction was open when the round took the last stable offset): orders of the slice in this
    round, its payments in the next, so the round's end is no point of the source stream."""
    state = CommitState()
    for item in (_written(3, "orders"), _complete(3, 0, 100)):
        state.add(item)
    assert state.cuts_no_transaction(5), "files whose slice reported below the end"
    state.add(_written(6, "orders"))  # the next slice's files ...
    assert not state.cuts_no_transaction(8), "... with its report still to come"
    state.add(_complete(9, 0, 200))
    assert not state.cuts_no_transaction(8), "the report at 9 belongs to the next round"
    assert state.cuts_no_transaction(10)
