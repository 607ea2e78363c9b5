"""Retries as a value: how often, how long and how far apart the sink tries a step again.

Each retry or wait loop of the sink (a table commit that conflicted, a batch that failed, a broker
answer worth waiting out, a schema id the registry does not know yet, ...) states its numbers as one
:class:`Retry`, next to the step it retries, the way Iceberg Java's
``Tasks.foreach(...).retry(n).exponentialBackoff(min, max, total, scale)`` states a commit's: how many
tries in all, until when, the pauses between them and which failures are worth another try. The loop
itself keeps what only it knows (what a try is, what to log, what to raise when none is left), and
asks a :class:`Tries` (one run of the policy) whether another try may follow.

Lowest layer: the Kafka clients, the catalog steps, the protocol and the Spark batches all retry.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True)
class Retry:
    """How a step is tried again: at most ``attempts`` tries, none begun past the deadline, with
    pauses in between growing from ``backoff_s``.

    The pause after the n-th failed try is ``backoff_s * multiplier ** (n-1)`` (``linear``:
    ``backoff_s * n``), at most ``max_backoff_s``, then spread by ``jitter``. ``clock`` and ``sleep``
    are the time source and the way of pausing (a test's fake clock, or a client's poll that serves
    callbacks while it waits).
    """

    attempts: int | None = None
    """Tries in all, the first one included (None: as many as the deadline allows)."""
    deadline_s: float | None = None
    """Seconds from the start of a run after which no try follows a failed one (None: no deadline)."""
    backoff_s: float = 0.0
    """The pause after the first failed try (0: none)."""
    multiplier: float = 1.0
    """Each further pause is the one before times this (1: every pause is ``backoff_s``)."""
    linear: bool = False
    """Pauses grow by ``backoff_s`` each instead: ``backoff_s * n`` after the n-th failed try."""
    max_backoff_s: float | None = None
    """No pause is longer than this (None: no cap)."""
    jitter: float = 0.0
    """Each pause is drawn uniformly from ``pause * (1 ± jitter)``, so racing processes drift apart."""
    pause_within_deadline: bool = False
    """True: a pause that would end past the deadline is not begun (the deadline is a budget for
    the waiting); False: a failed try ends the run only once the deadline has come."""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    """The exceptions :meth:`run` tries again after; any other propagates at once."""
    retry_if: Callable[[BaseException], bool] | None = None
    """Of those, the ones worth another try (None: all of them)."""
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    sleep: Callable[[float], object] = field(default=time.sleep, compare=False)
    uniform: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"a retry policy needs at least one attempt, not {self.attempts}")
        if self.backoff_s < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff in {self}")

    def pause_s(self, failed: int) -> float:
        """The pause after the ``failed``-th failed try, before jitter."""
        grown = self.backoff_s * failed if self.linear else self.backoff_s * self.multiplier ** (failed - 1)
        return grown if self.max_backoff_s is None else min(grown, self.max_backoff_s)

    def deadline(self) -> float | None:
        """When a run started now must stop trying, on :attr:`clock` (None: never)."""
        return None if self.deadline_s is None else self.clock() + self.deadline_s

    def start(self, deadline: float | None = None, sleep: Callable[[float], object] | None = None) -> Tries:
        """One run of this policy, its first try under way. ``deadline``: an end on :attr:`clock`
        the caller fixed already (a budget shared by several runs, a transaction's), instead of
        ``deadline_s`` from now; ``sleep``: how this run pauses, instead of :attr:`sleep`."""
        return Tries(self, self.deadline() if deadline is None else deadline, sleep or self.sleep)

    def run(self, call: Callable[[], _T], deadline: float | None = None) -> _T:
        """``call()``'s result, tried again after :attr:`retry_on` failures (that :attr:`retry_if`
        accepts) while the policy allows; the last failure propagates."""
        tries = self.start(deadline)
        while True:
            try:
                return call()
            except self.retry_on as exc:
                if (self.retry_if is not None and not self.retry_if(exc)) or not tries.again():
                    raise


class Tries:
    """One run of a :class:`Retry`: which try is under way, and whether another may follow."""

    def __init__(self, policy: Retry, deadline: float | None, sleep: Callable[[float], object]) -> None:
        self.policy = policy
        self.number = 1
        """The try under way, from 1."""
        self._deadline = deadline
        self._sleep = sleep

    @property
    def last(self) -> bool:
        """Whether the count allows no try after this one (the deadline may end the run sooner)."""
        return self.policy.attempts is not None and self.number >= self.policy.attempts

    def again(self) -> bool:
        """After a failed try: False when no other may follow (the caller gives up); otherwise the
        pause, then True with :attr:`number` counting the next try."""
        if self.last:
            return False
        policy = self.policy
        pause = policy.pause_s(self.number)
        if policy.jitter:
            pause *= policy.uniform(1 - policy.jitter, 1 + policy.jitter)
        if self._deadline is not None:
            now = policy.clock()
            if now + pause > self._deadline if policy.pause_within_deadline else now >= self._deadline:
                return False
        if pause > 0:
            self._sleep(pause)
        self.number += 1
        return True
