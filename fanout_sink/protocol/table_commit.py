"""One table's commit in a round: its due files become one snapshot, are skipped, or are refused.

The coordinator (:mod:`fanout_sink.protocol.coordinator`) runs :meth:`TableCommitter.commit` for
each table of a round, in parallel, and keeps the round around it. Per table, against table
metadata loaded for this commit (read where the catalog pointed just before the round's commits
started; after a conflict, loaded from the catalog again):

- The floor (I4): events below the control offset the table's state records are in the table
  already and skipped, for that table only; for files of a table swapped away (dropped, or renamed
  aside), the floor its last ``CommitToTable`` announced (the round's ``floors``, :func:`owed`).
- Dropped-and-recreated tables: files carry the table uuid they were written for; files for
  another uuid are never appended as they are (Iceberg also asserts the uuid at commit): their rows
  are rewritten into the new table when the columns fit (a change event's as its change set, resolved
  with the others), else an ERROR names the files. Files that
  do not fit, or whose table is gone, are copied to a quarantine folder no cleanup reaches.
- Announced files that no longer exist are left out (an ERROR names them): the table stays readable.
- Change tables: the round's changes are resolved into position deletes (last change wins).
- One snapshot with the data and delete files, its summary recording the control offset (and, for
  a round that is a consistent point, how many tables it commits), and the
  same state as table properties in the same metadata commit (so that snapshot expiry cannot erase
  it). It is committed exactly once (I3): PyIceberg's own commit retry would rebase the same append
  onto a new head without the floor check; a conflict instead reloads the table and re-checks the
  floor, as :data:`COMMIT_RETRY` says (3 tries).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Snapshot

from fanout_sink.errors import TableError
from fanout_sink.faults import fault_point
from fanout_sink.protocol import (
    channel,
    datafiles,
    file_merge,
    present_files,
    quarantine,
    row_delta,
    table_state,
)
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.pyiceberg_internals import snapshots, sql_catalog, transactions
from fanout_sink.retries import Retry

log = logging.getLogger(__name__)

COMMIT_RETRY = Retry(attempts=3)
"""Tries per table and round when the catalog reports a conflict (each reloads and re-checks the
floor), one right after the other."""
LOCATED_COMMIT_RETRY = replace(COMMIT_RETRY, attempts=4)
"""The same for a commit whose first try loads the table from the metadata location read before
the round: that try conflicts whenever the table moved on since, so it gets one more."""
MISSING_TABLE_WAIT = Retry(deadline_s=10.0, backoff_s=0.5, retry_on=(NoSuchTableError,))
"""A table not found at commit is looked up again every 0.5 s for 10 s before its files are refused:
dropping and creating a table (or renaming it aside and creating a new one) leaves a moment with no
table, and a round that meets it would otherwise quarantine rows the new table should get (chaos
found it)."""


@dataclass
class TableCommit:
    """What happened to one table in one round."""

    identifier: str
    outcome: str  # "committed" | "already-committed" | "refused" | "table-missing" | "failed"
    table_uuid: str | None = None
    snapshot_id: int | None = None
    files: int = 0
    rows: int = 0
    stale_files: int = 0  # written for another table uuid: never appended
    inserted: int = 0  # change tables: keys new to the table
    updated: int = 0  # change tables: keys whose live row was replaced
    deleted: int = 0  # change tables: live rows removed by deleted keys
    delete_files: int = 0  # change tables: position-delete files committed
    missing_files: int = 0  # announced but gone (never appended: an ERROR names them)
    refused_files: int = 0  # for a table that is gone or whose columns they do not fit: quarantined
    merged_files: int = 0  # small pending files written into fewer at commit (file_merge.py)
    attempts: int = 0
    error: str | None = None
    floor: int | None = None
    """``already-committed``: the floor the table held (its files were in it already)."""

    def floor_after(self, round_end: int) -> int | None:
        """The floor a ``CommitToTable`` announces for :attr:`table_uuid` after the round: its end for a
        commit; for files the table held already, the floor found (a commit whose outcome was lost,
        such as an executor task's, is then announced too: issue 47 item 7 (i)); None: nothing."""
        if self.outcome == "committed":
            return round_end
        return self.floor if self.outcome == "already-committed" and self.table_uuid is not None else None


@dataclass(frozen=True)
class TablePart:
    """One table's part of a round: what :meth:`TableCommitter.commit` is given (its arguments)."""

    identifier: str
    items: list[PendingFiles]
    round_end: int
    commit_id: str
    vtts: int | None
    floors: Mapping[str, int]
    location: str | None = None
    round_tables: int | None = None
    merge: bool = False


@dataclass(frozen=True)
class _Built:
    """An attempt's transaction, ready to commit, with what it appends."""

    txn: Transaction
    outcome: TableCommit
    added: list[DataFile]
    resolution: row_delta.Resolution | None

    def landed(self, snapshot: Snapshot | None) -> TableCommit:
        """The outcome once the transaction's commit landed with ``snapshot``."""
        outcome = self.outcome
        outcome.outcome = "committed"
        outcome.files = len(self.added)
        outcome.rows = sum(data_file.record_count for data_file in self.added)
        if self.resolution is not None:
            outcome.inserted, outcome.updated = self.resolution.inserted, self.resolution.updated
            outcome.deleted, outcome.delete_files = self.resolution.deleted, len(self.resolution.delete_files)
        outcome.error = None
        outcome.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        return outcome


@dataclass(frozen=True)
class StagedCommit:
    """A table's commit staged (:meth:`TableCommitter.stage`): its outcome once its pointer moved."""

    outcome: TableCommit
    swap: sql_catalog.PointerSwap


def owed(items: list[PendingFiles], floors: Mapping[str, int]) -> list[PendingFiles]:
    """The items no ``CommitToTable`` accounts for: at or above the floor ``floors`` holds for the
    table uuid they were written for."""
    return [p for p in items if p.offset >= floors.get(p.event.table.uuid, 0)]


class TableCommitter:
    """Commits one table's files of a round; one per coordinator, shared by its commit threads.

    It keeps nothing between calls: ``sink`` is the sink's name in table state, and what a round
    knows beyond the tables (the floors its ``CommitToTable`` events announced) comes with each
    call, the same on the driver and on an executor.
    """

    def __init__(self, sink: str, catalog: Catalog) -> None:
        self.sink = sink
        self.catalog = catalog

    def locate(self, identifiers: Iterable[str]) -> dict[str, str]:
        """Where the catalog points each of ``identifiers`` now, for the tables it holds, read in a
        few queries for a whole round (SQL catalogs; others: empty, each commit loads its table)."""
        found = sql_catalog.sql_metadata_locations(self.catalog, identifiers) or {}
        return {identifier: location for identifier, location in found.items() if location}

    def commit(
        self,
        identifier: str,
        items: list[PendingFiles],
        round_end: int,
        commit_id: str,
        vtts: int | None,
        floors: Mapping[str, int],
        location: str | None = None,
        round_tables: int | None = None,
        merge: bool = False,
    ) -> TableCommit:
        """Append ``items`` (the table's due files of round ``commit_id``) not yet in the table, as
        one snapshot recording ``round_end`` as the table's control offset (I4).

        ``floors``: per table uuid, the floor its last ``CommitToTable`` announced (the round's,
        :attr:`~.commit_runners.RoundTables.floors`): files written for a table swapped away are
        owed only at or above it.

        ``location``: the table's metadata location as :meth:`locate` read it, loaded for the first
        attempt instead of asking the catalog; if the table moved on since, the commit conflicts and
        the next attempt (:data:`LOCATED_COMMIT_RETRY`: one more than :data:`COMMIT_RETRY`) loads it
        from the catalog.

        ``round_tables``: how many tables the whole round commits, when its end is a consistent
        point (:attr:`~.commit_runners.RoundTables.tables`), recorded in the snapshot summary.
        ``merge``: the table's small append files are written into fewer first (:mod:`.file_merge`)."""
        outcome, merged = TableCommit(identifier, "failed"), file_merge.SmallFileMerge() if merge else None
        tries = (COMMIT_RETRY if location is None else LOCATED_COMMIT_RETRY).start()
        while True:
            attempt = outcome.attempts = tries.number
            part = TablePart(
                identifier, items, round_end, commit_id, vtts, floors, location, round_tables, merge
            )
            built = self._build(part, location if attempt == 1 else None, merged, outcome, staged=False)
            if isinstance(built, TableCommit):
                return built
            fault_point("coordinator.before-table-commit", table=identifier, catalog=self.catalog)
            try:
                committed = built.txn.commit_transaction()
            except CommitFailedException as exc:
                log.warning(
                    "commit of %s conflicted (attempt %d): reloading and re-checking", identifier, attempt
                )
                outcome.error = str(exc)
                if tries.again():
                    continue
                return outcome
            fault_point("coordinator.after-table-commit", table=identifier)
            return built.landed(committed.current_snapshot())

    def commit_part(self, part: TablePart) -> TableCommit:
        """:meth:`commit` of ``part``."""
        return self.commit(
            part.identifier, part.items, part.round_end, part.commit_id, part.vtts, part.floors,
            part.location, part.round_tables, part.merge,
        )  # fmt: skip

    @property
    def stages(self) -> bool:
        """Whether this committer's catalog can stage commits for :meth:`swap` (SQL catalogs)."""
        return sql_catalog.supports_pointer_swaps(self.catalog)

    def stage(self, part: TablePart) -> TableCommit | StagedCommit:
        """The first attempt of :meth:`commit` without its last step: the snapshot's files and the new
        metadata file are written, the catalog's pointer is not moved. A :class:`StagedCommit` lands
        with :meth:`swap` (its pointer moved together with others'); a :class:`TableCommit` is the
        table's outcome already (nothing to append, refused, table missing). A pointer that moved
        since ``location`` was read is found by the swap, and the table goes through :meth:`commit`."""
        merged = file_merge.SmallFileMerge() if part.merge else None
        outcome = TableCommit(part.identifier, "failed", attempts=1)
        built = self._build(part, part.location, merged, outcome, staged=True)
        if isinstance(built, TableCommit):
            return built
        fault_point("coordinator.before-table-commit", table=part.identifier, catalog=self.catalog)
        committed = built.txn.commit_transaction()  # writes the metadata file, moves nothing
        return StagedCommit(built.landed(committed.current_snapshot()), transactions.pointer_swap(built.txn))

    def swap(self, staged: Sequence[StagedCommit]) -> set[str]:
        """Land ``staged`` commits: their pointers moved in one catalog transaction, each only if it
        still points where its commit was staged; the identifiers that landed (the others conflicted)."""
        return sql_catalog.swap_pointers(self.catalog, [s.swap for s in staged]) if staged else set()

    def _build(
        self,
        part: TablePart,
        location: str | None,
        merged: file_merge.SmallFileMerge | None,
        outcome: TableCommit,
        staged: bool,
    ) -> TableCommit | _Built:
        """One attempt up to the catalog commit: the table loaded (from ``location`` if given), its
        floor checked, and either the outcome when nothing is to be appended, or the transaction
        holding the round's snapshot and state."""
        identifier, items, floors, vtts = part.identifier, part.items, part.floors, part.vtts
        try:
            table = self._table_to_decide_on(identifier, items, location)
        except NoSuchTableError:
            return self._table_missing(identifier, owed(items, floors), outcome)
        table_uuid = str(table.metadata.table_uuid)
        outcome.table_uuid = table_uuid
        floor = table_state.read_state(table, self.sink).next_control_offset(channel.CONTROL_PARTITION)
        todo = [p for p in items if p.offset >= floor]
        stale = owed([p for p in todo if p.event.table.uuid != table_uuid], floors)
        outcome.stale_files = sum(len(p.event.files) for p in stale)
        current, outcome.missing_files = present_files.present(
            table, [p for p in todo if p.event.table.uuid == table_uuid], outcome.missing_files
        )
        appends = [datafiles.from_record(r, table) for p in current if not p.event.key for r in p.event.files]
        rewritten = self._rewrite_stale(table, stale, outcome) if stale else {}
        appends += [f for p in stale if not p.event.key for f in rewritten.get(p.offset, ())]
        # A stale change set stays a change set: flattened into appends, its keys would be in
        # the table twice and its deletes lost (issue 33 item 1, change tables).
        changes = [p for p in current if p.event.key] + [
            p for p in stale if p.event.key and p.offset in rewritten
        ]
        if merged is not None and not changes:
            appends, outcome.merged_files = merged(table, appends), merged.merged
        if not appends and not changes:
            outcome.outcome = "refused" if outcome.refused_files else "already-committed"
            outcome.floor = floor or None
            return outcome
        properties = table_state.summary_properties(
            self.sink, {channel.CONTROL_PARTITION: part.round_end}, part.commit_id, vtts
        )
        added, resolution = appends, None
        if changes:
            changed, resolution = self._resolve(table, changes, rewritten)
            added = appends + changed
        snapshot_properties = dict(properties)
        if part.round_tables is not None:
            snapshot_properties.update(table_state.round_properties(self.sink, part.round_tables))
        if resolution is not None:
            snapshot_properties.update(
                table_state.change_properties(
                    self.sink, resolution.inserted, resolution.updated, resolution.deleted
                )
            )
            fault_point("coordinator.after-resolve", table=identifier)
        txn = transactions.no_retry_transaction(table, staged=staged)
        # Each file under the spec it was written with: the spec may have changed since. Data
        # and position deletes in one snapshot, the one that records the control offset (I4).
        delta = snapshots.RowDelta(txn, table.io, snapshot_properties)
        with delta:
            for data_file in added:
                delta.append_data_file(data_file)
            for delete_file in resolution.delete_files if resolution else ():
                delta.add_delete_file(delete_file)
        # The same state as table properties, in the same metadata commit: it outlives the
        # snapshot when others commit on top and the sink's snapshots are expired.
        txn.set_properties(properties)
        if stale_keys := table_state.stale_properties(table, self.sink, vtts):
            txn.remove_properties(*stale_keys)
        return _Built(txn, outcome, added, resolution)

    def _table_to_decide_on(self, identifier: str, items: list[PendingFiles], location: str | None) -> Table:
        """The table from ``location``, or from the catalog when there is none or when files for
        another table uuid are due: those are rewritten or refused against the current table, and a
        table dropped and recreated after ``location`` was read must not be judged by the old one (a
        commit would conflict, but a refusal commits nothing)."""
        table = self._load_table_or_wait(identifier, location)
        if location is not None and any(p.event.table.uuid != str(table.metadata.table_uuid) for p in items):
            return self._load_table_or_wait(identifier)
        return table

    def _load_table_or_wait(self, identifier: str, location: str | None = None) -> Table:
        """The table, from ``location`` when given and still there, else from the catalog, looked up
        again while it is not found, as :data:`MISSING_TABLE_WAIT` says."""
        if location is not None:
            with contextlib.suppress(FileNotFoundError):  # dropped and purged since: ask the catalog
                return sql_catalog.load_table_at(self.catalog, identifier, location)
        return MISSING_TABLE_WAIT.run(lambda: self.catalog.load_table(identifier))

    def _table_missing(self, identifier: str, owed: list[PendingFiles], outcome: TableCommit) -> TableCommit:
        """The table is gone: its owed files (the rest went into the table before it was dropped) are
        quarantined and named in an ERROR."""
        if not owed:
            outcome.outcome = "already-committed"
            return outcome
        paths = [r.file_path for p in owed for r in p.event.files]
        outcome.refused_files = len(paths)
        log.error(
            "table %s is gone: %d file(s) with %d row(s) written for it are NOT appended: %s, %s\n"
            "  fix: the rows are in those Parquet files; recreate the table and add them by hand "
            "if they are wanted.",
            identifier,
            len(paths),
            sum(r.record_count for p in owed for r in p.event.files),
            ", ".join(paths),
            quarantine.quarantined(load_file_io(self.catalog.properties, paths[0]), paths, self.sink)
            if paths
            else "",
        )
        outcome.outcome = "table-missing"
        return outcome

    def _rewrite_stale(
        self, table: Table, stale: list[PendingFiles], outcome: TableCommit
    ) -> dict[int, list[DataFile]]:
        """Files written for an older table of this name (dropped and recreated while they were in
        flight, or between two chunks of a slice), rewritten as files of ``table`` when their
        columns fit, per event (by control offset: a change event's files stay its change set);
        otherwise none, all quarantined and named in an ERROR (``outcome.refused_files``).
        """
        identifier = ".".join(table.name())
        records = [r for p in stale for r in p.event.files]
        paths = [r.file_path for r in records]
        rows = sum(r.record_count for r in records)
        try:
            rewritten = {
                p.offset: datafiles.rewrite_data_files(table, [r.file_path for r in p.event.files])
                for p in stale
            }
        except (TableError, OSError, pa.ArrowException) as exc:
            outcome.refused_files = len(paths)
            log.error(
                "table %s was dropped and recreated (uuid now %s): %d file(s) with %d row(s) written for "
                "the old table do not fit the new one (%s) and are NOT appended: %s, %s\n"
                "  fix: the rows are in those Parquet files; add them to the table by hand if they are "
                "wanted (the sink goes on with the new table).",
                identifier,
                table.metadata.table_uuid,
                len(paths),
                rows,
                exc,
                ", ".join(paths),
                quarantine.quarantined(table.io, paths, self.sink),
            )
            return {}
        log.warning(
            "table %s was dropped and recreated: %d file(s) with %d row(s) written for the old table "
            "rewritten into the new one",
            identifier,
            len(paths),
            rows,
        )
        return rewritten

    def _resolve(
        self, table: Table, changes: list[PendingFiles], rewritten: dict[int, list[DataFile]]
    ) -> tuple[list[DataFile], row_delta.Resolution]:
        """A change table's events of this round, in control-topic order (a partition's slices in
        offset order), resolved into position deletes against the table as loaded for this attempt;
        an event written for an older table of this name with its files ``rewritten`` (its deleted
        keys are read by column name)."""
        keys = {p.event.key for p in changes}
        if len(keys) > 1:
            raise TableError(
                f"change events for table {'.'.join(table.name())} carry different keys {sorted(keys)}: "
                "the route's changes.key changed while files were in flight.\n  fix: restore the "
                "previous key until these events are committed, then change it (and the table's "
                "identifier fields) in one step"
            )
        (key,) = keys
        sets = [
            row_delta.ChangeSet(
                data_files=rewritten[p.offset]
                if p.offset in rewritten
                else [datafiles.from_record(r, table) for r in p.event.files],
                deleted_keys=datafiles.read_key_files(table, key, p.event.deleted_keys),
            )
            for p in sorted(changes, key=lambda p: p.offset)
        ]
        return [f for change in sets for f in change.data_files], row_delta.resolve(table, key, sets)
