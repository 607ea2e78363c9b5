"""What became of each record of one slice, told by the processor itself (``fanout-sink route``).

A :class:`SliceTrace` set as :attr:`~fanout_sink.transform.processor.RoutingProcessor.trace` is
handed every record's outcome at the point the processor decides it, so a preview of a routing
config runs the very decode -> route -> convert path the workers run instead of a copy of it.
Indices are rows of the raw slice the processor was called with. The workers never set one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fanout_sink.transform.routing import Routes

OutcomeKind = Literal["row", "delete", "superseded", "dead-letter", "filtered"]


@dataclass(frozen=True)
class Outcome:
    """One outcome of a record: a row (or a deleted key) of ``table``, superseded by a later change
    of its key, a dead letter, or filtered; ``reason`` says why for the last two."""

    kind: OutcomeKind
    table: str | None = None
    reason: str | None = None
    stage: str | None = None
    """Where a dead letter was decided: tombstone, decode, route, convert, truncate."""
    column: str | None = None
    policy: bool = False
    """Dead-lettered by configuration (tombstones, unmatched, truncates), not because it is bad."""


@dataclass
class SliceTrace:
    """Outcomes per raw record index, and each table's rows' raw indices in row order."""

    outcomes: dict[int, list[Outcome]] = field(default_factory=dict)
    row_origins: dict[str, np.ndarray] = field(default_factory=dict)
    """Per table, the raw index of each row of its ``TableRows.rows`` (same order)."""

    def _add(self, indices: np.ndarray | list[int], outcome: Outcome) -> None:
        for index in np.asarray(indices, dtype=np.int64).tolist():
            self.outcomes.setdefault(index, []).append(outcome)

    def filtered(self, indices: np.ndarray, reason: str, table: str | None = None) -> None:
        self._add(indices, Outcome("filtered", table=table, reason=reason))

    def routed(self, records: np.ndarray, routes: Routes, reason: str) -> None:
        """The records (raw indices of the view's positions) no route took and ``unmatched`` dropped."""
        if not routes.dropped:
            return
        taken = np.zeros(len(records), dtype=bool)
        for positions in routes.tables.values():
            taken[positions] = True
        taken[np.asarray([pos for pos, _ in routes.dead], dtype=np.int64)] = True
        self.filtered(records[~taken], reason)

    def failed(
        self, index: int, stage: str, reason: str, table: str | None, column: str | None, policy: bool
    ) -> None:
        outcome = Outcome("dead-letter", table, reason, stage=stage, column=column, policy=policy)
        self._add([index], outcome)

    def rows(self, table: str, origins: np.ndarray) -> None:
        self.row_origins[table] = np.asarray(origins, dtype=np.int64)
        self._add(origins, Outcome("row", table=table))

    def deletes(self, table: str, origins: np.ndarray) -> None:
        self._add(origins, Outcome("delete", table=table))

    def superseded(self, table: str, origins: np.ndarray) -> None:
        reason = "a later change of the same key in the slice wins"
        self._add(origins, Outcome("superseded", table=table, reason=reason))
