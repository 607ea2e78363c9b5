"""Every table of a sink read at one point of the stream: the newest round that all of them hold.

A round commits each table it has files for in a snapshot of its own, so between two tables'
commits a reader can see orders of a batch whose payments are not in yet; and a round whose commit
of one table failed leaves that table behind until a later round. This module finds, from the
tables' snapshot summaries alone (no Kafka), the newest *consistent point* and, per table, the
snapshot that holds the stream up to it:

- A round's end is a consistent point when every table it had files for committed them in that
  round: each of its snapshots records ``round-tables`` (how many tables the round commits; absent
  when the round's end cut a worker transaction, see ``CommitState.cuts_no_transaction``), and the
  tables of the sink hold that many snapshots with its commit id. Then no file below the round's end
  waits in any table, so each table's newest sink snapshot at or below it holds exactly the records
  below it. A partial round (a table's commit failed, committed by a later round together with
  newer files) is not: the point stays at the newest round before it that every table holds.
- Per table, the snapshot to read is the newest one before the table's first sink snapshot past
  the point: the round's own snapshot, or for a table without files in that round the one before
  (even if the table was committed in later rounds), or a maintenance snapshot on top of it (the
  same rows). ``None``: the table held no row of the sink at that point.

``fanout-sink sql --consistent`` registers each table as a temporary view at its snapshot
(``VERSION AS OF``). In Python::

    point = consistent_read.latest_point(catalog, "shop-sink")
    orders = point.scan(catalog.load_table("shop.orders")).to_arrow()
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysFalse
from pyiceberg.table import DataScan, Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from fanout_sink.errors import FanoutSinkError
from fanout_sink.protocol import table_state
from fanout_sink.protocol.channel import CONTROL_PARTITION


class NoConsistentPointError(FanoutSinkError):
    """No round of the sink is held whole by its tables, or a table keeps no snapshot at the point."""


@dataclass(frozen=True)
class ConsistentPoint:
    """The newest round every table of a sink holds, and the snapshot to read of each table."""

    sink: str
    commit_id: str
    control_offset: int
    """The round's end on the control topic: each table holds its records delivered below it."""
    snapshots: dict[str, int | None]
    """Per table identifier (``namespace.name``), the snapshot id to read; None: the table held no
    row of the sink at this point (read it as empty)."""

    def scan(self, table: Table) -> DataScan:
        """A scan of ``table`` (a table of :attr:`snapshots`) at this point."""
        identifier = ".".join(table.name())
        if identifier not in self.snapshots:
            raise NoConsistentPointError(
                f"table {identifier} holds no commit of sink {self.sink!r}; "
                f"the tables at this point are {', '.join(self.snapshots)}"
            )
        snapshot_id = self.snapshots[identifier]
        if snapshot_id is None:
            return table.scan(row_filter=AlwaysFalse())
        return table.scan(snapshot_id=snapshot_id)


@dataclass(frozen=True)
class _Commit:
    """One sink snapshot of a table: its round, the round's end and its table count."""

    snapshot_id: int
    commit_id: str
    control_offset: int
    round_tables: int | None


def _commits(table: Table, sink: str) -> list[_Commit]:
    """The sink's snapshots in the table's current ancestry, newest first."""
    found = []
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        state = table_state.snapshot_state(snapshot, sink)
        if state is not None and state.commit_id is not None:
            offset = state.next_control_offset(CONTROL_PARTITION)
            found.append(_Commit(snapshot.snapshot_id, state.commit_id, offset, state.round_tables))
    return found


def whole_rounds(commits: dict[str, list[_Commit]]) -> list[tuple[int, str]]:
    """The rounds every table holds its part of, as ``(round end, commit id)``, newest first: the
    rounds whose ``round-tables`` equals the number of tables with a snapshot of the round."""
    held = Counter(c.commit_id for table_commits in commits.values() for c in table_commits)
    rounds = {
        c.commit_id: (c.control_offset, c.commit_id)
        for table_commits in commits.values()
        for c in table_commits
        if c.round_tables is not None and held[c.commit_id] == c.round_tables
    }
    return sorted(rounds.values(), reverse=True)


def snapshot_at(table: Table, sink: str, control_offset: int) -> int | None:
    """The snapshot of ``table`` that holds the sink's records below ``control_offset`` and none
    above: the newest one before the table's first sink snapshot past the point (None: there is
    none, the table held nothing of the sink then). Raises when that snapshot was expired."""
    current = table.current_snapshot()
    chosen = current.snapshot_id if current is not None else None
    first_past: Snapshot | None = None
    for snapshot in ancestors_of(current, table.metadata):
        state = table_state.snapshot_state(snapshot, sink)
        if state is None:
            continue
        if state.next_control_offset(CONTROL_PARTITION) <= control_offset:
            break
        chosen, first_past = snapshot.parent_snapshot_id, snapshot
    # Iceberg Java keeps an expired parent's id; PyIceberg's expiry clears it, so a table whose
    # first snapshot is not its first commit lost its history.
    expired = (chosen is not None and table.metadata.snapshot_by_id(chosen) is None) or (
        chosen is None and first_past is not None and not _first_of_table(first_past)
    )
    if expired:
        raise NoConsistentPointError(
            f"table {'.'.join(table.name())} no longer keeps the snapshot that holds control offset "
            f"{control_offset} of sink {sink!r} (it was expired); read it without --consistent, or keep "
            "more snapshots (maintenance.min-snapshots-to-keep)"
        )
    return chosen


def _first_of_table(snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` added every data file its table holds: nothing came before it."""
    summary = snapshot.summary
    if summary is None or "total-data-files" not in summary:
        return False
    return summary.get("total-data-files") == summary.get("added-data-files", "0")


def latest_point(catalog: Catalog, sink: str) -> ConsistentPoint:
    """The newest round of ``sink`` that every table of it holds, with the snapshot of each table to
    read there (:class:`ConsistentPoint`); :class:`NoConsistentPointError` when there is none."""
    tables = {found.identifier: found.table for found in table_state.sink_tables(catalog, sink)}
    if not tables:
        raise NoConsistentPointError(
            f"no table of the catalog holds a commit of sink {sink!r}; check the config's name and catalog"
        )
    commits = {identifier: _commits(table, sink) for identifier, table in tables.items()}
    rounds = whole_rounds(commits)
    if not rounds:
        raise NoConsistentPointError(
            f"no round of sink {sink!r} is held whole by its {len(tables)} table(s) (a round counts when "
            "every table it committed keeps its snapshot and none failed; rounds written before the sink "
            "recorded round-tables do not); read without --consistent, or again after the next round"
        )
    control_offset, commit_id = rounds[0]
    snapshots = {
        identifier: snapshot_at(table, sink, control_offset) for identifier, table in sorted(tables.items())
    }
    return ConsistentPoint(sink, commit_id, control_offset, snapshots)
