"""When a commit round is due, as plain rules over a fake clock (no broker needed)."""

from __future__ import annotations

from fanout_sink.protocol import events as ev
from fanout_sink.protocol import round_trigger as trigger
from fanout_sink.protocol.channel import ControlEvent
from fanout_sink.protocol.round_trigger import RoundTrigger


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _report(control_offset: int, partition: int, next_offset: int) -> ControlEvent:
    payload = ev.DataComplete(topic="s", partition=partition, next_offset=next_offset)
    return ControlEvent(control_offset, ev.Event(sink="x", payload=payload))


def _trigger(clock: Clock, interval_s: float = 60.0, min_interval_s: float = 2.0) -> RoundTrigger:
    rounds = RoundTrigger(interval_s, min_interval_s, clock=clock)
    clock.now += min_interval_s  # start-up took longer than the minimum
    return rounds


def test_a_round_is_due_once_every_planned_range_reported_not_before() -> None:
    clock = Clock()
    rounds = _trigger(clock)
    rounds.expect(7, {("s", 0): (0, 100), ("s", 1): (50, 80), ("s", 2): (30, 30)})  # s/2 did not move
    rounds.observe(_report(10, 0, 100))
    assert rounds.due() is None, "s/1 has not reported yet"
    rounds.observe(_report(11, 1, 60))  # an earlier slice's report (a retried batch) does not count
    assert rounds.due() is None
    rounds.observe(_report(12, 1, 80))
    assert rounds.due() == trigger.BATCH_COMPLETE
    rounds.started()
    rounds.done(round_end=13)
    assert rounds.due() is None and rounds.pending_batches() == []


def test_the_interval_stays_an_upper_bound_and_the_minimum_a_floor() -> None:
    clock = Clock()
    rounds = RoundTrigger(10.0, 3.0, clock=clock)
    clock.now += 9.9
    assert rounds.due() is None
    clock.now += 0.1
    assert rounds.due() == trigger.INTERVAL, "no batch reported: the interval runs a round"
    rounds.started()
    rounds.done(round_end=5)
    rounds.expect(1, {("s", 0): (0, 10)})
    rounds.observe(_report(5, 0, 10))
    clock.now += 2.9
    assert rounds.due() is None, "a complete batch waits for the minimum gap after the last round"
    clock.now += 0.1
    assert rounds.due() == trigger.BATCH_COMPLETE


def test_a_batch_completing_while_a_round_runs_gets_a_round_of_its_own_unless_the_round_held_it() -> None:
    clock = Clock()
    rounds = _trigger(clock, min_interval_s=0.0)
    rounds.expect(1, {("s", 0): (0, 10)})
    rounds.expect(2, {("s", 1): (0, 10)})
    rounds.started()  # an interval round starts; neither batch has reported
    rounds.observe(_report(4, 0, 10))  # read by that round below its end: the round holds batch 1
    rounds.observe(_report(9, 1, 10))  # past its end: batch 2 is the next round's
    rounds.done(round_end=6)
    assert rounds.pending_batches() == [2]
    assert rounds.due() == trigger.BATCH_COMPLETE


def test_a_failed_round_leaves_its_batch_due() -> None:
    clock = Clock()
    rounds = _trigger(clock, min_interval_s=1.0)
    rounds.expect(3, {("s", 0): (0, 10)})
    rounds.observe(_report(2, 0, 10))
    rounds.started()  # ... and the round fails: done() is never called
    clock.now += 1.0
    assert rounds.due() == trigger.BATCH_COMPLETE and rounds.pending_batches() == [3]


def test_ranges_delivered_before_they_were_planned_count_as_reported() -> None:
    clock = Clock()
    rounds = _trigger(clock)
    restored = ev.CommitComplete(commit_id="c", delivered=ev.delivered_map({("s", 0): 40}))
    rounds.observe(ControlEvent(3, ev.Event(sink="x", payload=restored)))
    rounds.expect(5, {("s", 0): (20, 40)})  # replayed after a restart: its slice writes no new report
    assert rounds.due() == trigger.BATCH_COMPLETE
    rounds.started()
    rounds.done(round_end=4)
    rounds.expect(6, {("s", 0): (40, 60), ("s", 1): (0, 5)})
    rounds.observe(_report(8, 0, 60))
    assert rounds.due() is None
    rounds.delivered_before(6, [("s", 1)])  # its slice found s/1 in the sink group: no new report
    clock.now += 2.0
    assert rounds.due() == trigger.BATCH_COMPLETE
    rounds.started()
    rounds.done(round_end=9)
    assert rounds.pending_batches() == []


def test_an_empty_batch_is_no_reason_for_a_round_and_the_default_floor_fits_a_short_interval() -> None:
    clock = Clock()
    rounds = _trigger(clock)
    rounds.expect(0, {("s", 0): (5, 5)})
    assert rounds.due() is None and rounds.pending_batches() == []
    assert RoundTrigger(0.5, 2.0).min_interval_s == 0.5


def test_positions_of_a_deleted_and_recreated_topic_do_not_complete_the_new_topics_batches() -> None:
    clock = Clock()
    rounds = _trigger(clock)
    old = ev.DataComplete(topic="s", partition=0, next_offset=100, topic_id="old-id")
    new = ev.DataComplete(topic="s", partition=1, next_offset=5, topic_id="new-id")
    for offset, payload in enumerate((old, new)):
        rounds.observe(ControlEvent(offset, ev.Event(sink="x", payload=payload)))
    rounds.expect(1, {("s", 0): (0, 50)})  # the new topic's s/0 has delivered nothing yet
    assert rounds.due() is None


def test_a_batch_the_driver_finished_is_unreported_until_each_of_its_ranges_reports() -> None:
    """The driver's word that a batch returned does not make its reports readable (their markers
    may come just after): a stop's final round waits while the batch is listed here."""
    clock = Clock()
    rounds = _trigger(clock)
    rounds.expect(3, {("s", 0): (0, 10), ("s", 1): (0, 5)})
    rounds.expect(4, {("s", 0): (10, 20)})  # planned, not finished (the app stopped mid-batch)
    assert rounds.unreported() == [], "nothing finished yet"
    rounds.finished(3)
    assert rounds.unreported() == [3]
    rounds.observe(_report(20, 0, 10))
    assert rounds.unreported() == [3], "s/1 has not reported"
    rounds.delivered_before(3, [("s", 1)])  # or it found its range delivered: no report comes
    assert rounds.unreported() == []
    rounds.finished(99)  # a batch never planned here (empty) is nothing to wait for
    assert rounds.unreported() == []
