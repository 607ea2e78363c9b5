"""The retry policy value: its counts, deadlines and pauses, on a fake clock (nothing sleeps)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from fanout_sink.retries import Retry


class _Clock:
    """A clock that a pause moves forward at once; every pause is recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


def _faked(policy: Retry, clock: _Clock) -> Retry:
    return dataclasses.replace(policy, clock=clock.time, sleep=clock.sleep)


def _failing(times: int, error: BaseException, result: str = "done") -> tuple[Callable[[], str], list[int]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            raise error
        return result

    return call, calls


def test_a_count_ends_the_run_and_the_last_failure_propagates(clock: _Clock) -> None:
    policy = _faked(Retry(attempts=3), clock)
    call, calls = _failing(5, ValueError("conflict"))

    with pytest.raises(ValueError, match="conflict"):
        policy.run(call)

    assert calls == [1, 2, 3]
    assert clock.pauses == []  # no backoff: no pause, not even sleep(0)


def test_a_try_that_succeeds_returns_its_result(clock: _Clock) -> None:
    call, calls = _failing(2, ValueError("conflict"))

    assert _faked(Retry(attempts=3), clock).run(call) == "done"
    assert calls == [1, 2, 3]


def test_exponential_backoff_is_capped() -> None:
    policy = Retry(backoff_s=0.1, multiplier=2, max_backoff_s=1.0)

    assert [policy.pause_s(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_linear_backoff_grows_by_its_first_pause() -> None:
    assert [Retry(backoff_s=0.5, linear=True).pause_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 1.5]


def test_jitter_spreads_each_pause_around_its_nominal_value(clock: _Clock) -> None:
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    policy = dataclasses.replace(
        _faked(Retry(attempts=3, backoff_s=0.5, linear=True, jitter=0.5), clock), uniform=uniform
    )
    tries = policy.start()

    assert tries.again() and tries.again() and not tries.again()
    assert drawn == [(0.5, 1.5), (0.5, 1.5)]
    assert clock.pauses == [0.75, 1.5]


def test_a_deadline_ends_the_run_once_it_has_come(clock: _Clock) -> None:
    """The default: a try may begin as long as the deadline has not come, its pause may end past it."""
    policy = _faked(Retry(deadline_s=1.0, backoff_s=0.3), clock)
    call, calls = _failing(100, TimeoutError("slow"))

    with pytest.raises(TimeoutError):
        policy.run(call)

    assert clock.pauses == [0.3, 0.3, 0.3, 0.3]  # the last pause ends at 1.2 s
    assert len(calls) == 5


def test_a_deadline_as_a_budget_begins_no_pause_that_would_end_past_it(clock: _Clock) -> None:
    policy = _faked(Retry(deadline_s=5.0, backoff_s=0.1, multiplier=2, max_backoff_s=1.0), clock)
    tries = dataclasses.replace(policy, pause_within_deadline=True).start()

    while tries.again():
        pass

    assert clock.pauses == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert clock.now - 100.0 <= 5.0
    assert tries.number == 8


def test_a_deadline_fixed_by_the_caller_replaces_the_policys(clock: _Clock) -> None:
    policy = _faked(Retry(deadline_s=60.0, backoff_s=1.0), clock)
    tries = policy.start(deadline=clock.now + 2.0)

    assert tries.again() and tries.again() and not tries.again()
    assert tries.number == 3


def test_a_run_may_pause_its_own_way(clock: _Clock) -> None:
    """A client's poll serves its callbacks while it waits: the pause is handed to it."""
    polled: list[float] = []
    tries = _faked(Retry(attempts=2, backoff_s=0.05), clock).start(sleep=polled.append)

    assert tries.again()
    assert polled == [0.05] and clock.pauses == []


def test_last_tells_the_final_try_before_it_fails() -> None:
    tries = Retry(attempts=2).start()

    assert not tries.last
    assert tries.again()
    assert tries.last and tries.number == 2
    assert not tries.again()
    assert tries.number == 2  # a refused try is not counted


def test_without_a_count_or_deadline_a_run_goes_on(clock: _Clock) -> None:
    tries = _faked(Retry(), clock).start()

    assert all(tries.again() for _ in range(1000))
    assert not tries.last


def test_only_the_failures_named_are_tried_again(clock: _Clock) -> None:
    policy = _faked(Retry(attempts=5, retry_on=(KeyError,), retry_if=lambda e: "again" in str(e)), clock)
    other, other_calls = _failing(1, ValueError("again"))
    refused, refused_calls = _failing(1, KeyError("final"))
    accepted, accepted_calls = _failing(2, KeyError("again"))

    with pytest.raises(ValueError):
        policy.run(other)
    with pytest.raises(KeyError):
        policy.run(refused)
    assert policy.run(accepted) == "done"
    assert (other_calls, refused_calls, accepted_calls) == ([1], [1], [1, 2, 3])


@pytest.mark.parametrize(
    "changes",
    [{"attempts": 0}, {"backoff_s": -1.0}, {"multiplier": 0.5}, {"jitter": 1.5}],
)
def test_a_policy_that_cannot_run_is_refused(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Retry(**changes)  # type: ignore[arg-type]
