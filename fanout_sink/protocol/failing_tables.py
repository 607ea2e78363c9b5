"""Tables whose commit keeps failing: the coordinator's record of them across rounds, and the ERROR
each of them gets every round.

A table's failed commit does not fail the round: its files stay pending and hold the control topic's
low watermark, the other tables keep committing. So that such a table cannot go unnoticed, every
round it fails in says so at ERROR, with how long its oldest file waits; the first failure's
traceback is logged where the commit ran (:func:`~.commit_runners.commit_in_threads`), not again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.table_commit import TableCommit

log = logging.getLogger(__name__)


@dataclass
class TableFailure:
    """A table whose commit failed in consecutive rounds (forgotten at its next successful round)."""

    rounds: int
    since_ms: int
    error: str | None = None


class FailingTables(Mapping[str, TableFailure]):
    """The tables whose commit failed in the latest rounds, by identifier."""

    def __init__(self) -> None:
        self._tables: dict[str, TableFailure] = {}

    def __getitem__(self, identifier: str) -> TableFailure:
        return self._tables[identifier]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def record(self, due: dict[str, list[PendingFiles]], results: dict[str, TableCommit]) -> None:
        """One ERROR per failing table and round, so a table that never recovers cannot go unnoticed.

        Its files stay pending and hold the low watermark (the control topic is re-read from there
        after a restart); the other tables keep committing meanwhile.
        """
        now_ms = int(time.time() * 1000)
        for identifier, outcome in results.items():
            if outcome.outcome != "failed":
                if (recovered := self._tables.pop(identifier, None)) is not None:
                    log.info("table %s commits again after %d failed round(s)", identifier, recovered.rounds)
                continue
            failure = self._tables.setdefault(identifier, TableFailure(0, now_ms))
            failure.rounds += 1
            failure.error = outcome.error
            oldest = min(due[identifier], key=lambda p: p.offset)
            age = "unknown" if oldest.written_ms is None else f"{(now_ms - oldest.written_ms) / 1000:.0f}s"
            log.error(
                "commit of table %s failed %d round(s) in a row (%s); %d file event(s) pending, the "
                "oldest pending for %s (control offset %d), which holds the control topic's low "
                "watermark for all tables while the others keep committing.\n"
                "  fix: repair what the error names (catalog reachable? table metadata readable? "
                "specs/columns of the files still in the table?); the next round then appends the "
                "pending files exactly once. Until then keep the control topic's retention longer "
                "than that age.",
                identifier,
                failure.rounds,
                outcome.error,
                len(due[identifier]),
                age,
                oldest.offset,
                extra={"table": identifier},
            )
