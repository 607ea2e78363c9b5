"""A round's table commits and who runs them: the seam between the coordinator and its commit workers.

The coordinator (:mod:`fanout_sink.protocol.coordinator`) decides which tables a round commits and
what follows (settling, the low watermark, ``CommitToTable``/``CommitComplete``); the commits
themselves are independent per table, so they can run anywhere a
:class:`~fanout_sink.protocol.table_commit.TableCommitter` can load the tables: in threads of the
coordinator's process (:class:`ThreadedCommits`, the default) or spread over the Spark cluster's
Python workers (``fanout_sink.spark.executor_commits``), which lifts the one GIL that caps the driver.

Wherever a table is committed, the same rules hold (I3, I4): every attempt re-checks the table's
floor on freshly loaded metadata, so a commit repeated by another process, a retried task or the
next round appends nothing twice. A table without an outcome (a timeout, a lost task, a runner that
failed) counts as ``failed``: its files stay pending and hold the low watermark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Protocol

from pyiceberg.exceptions import CommitFailedException

from fanout_sink import durable_io
from fanout_sink.faults import fault_point
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.table_commit import StagedCommit, TableCommit, TableCommitter, TablePart

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundTables:
    """One round's due tables as a runner gets them. Picklable, so that a runner can ship parts of it
    (:meth:`split`) to other processes."""

    due: dict[str, list[PendingFiles]]
    """Per table identifier, its pending files below the round end."""
    round_end: int
    commit_id: str
    vtts: int | None
    deadline: float
    """When the round stops waiting for a table, on this process's monotonic clock
    (``time.monotonic()``). Pickled as the time left and counted down on the receiving process's own
    clock: a wall-clock deadline compared on an executor was off by the hosts' clock skew, and one
    ahead by more than the commit timeout reported every table ``failed`` while its commit went on
    (issue 47 item 7 (ii))."""
    floors: dict[str, int] = field(default_factory=dict)
    """Per table uuid of the due files, the floor its last ``CommitToTable`` announced
    (``CommitState.committed_through``): what every committer checks files of a table swapped away
    against, wherever it runs."""
    failing: frozenset[str] = frozenset()
    """Tables that failed in the rounds before: their next failure's traceback is not logged again."""
    merging: frozenset[str] = frozenset()
    """Tables with a ``commit-interval`` of their own: their small files are merged into fewer at
    commit (:mod:`~fanout_sink.protocol.file_merge`)."""
    tables: int | None = None
    """How many tables the whole round commits (``due`` before any :meth:`split`), when the round's
    end cuts no worker transaction (``CommitState.cuts_no_transaction``): each table's snapshot
    records it, so that a reader counting the round's snapshots knows whether every table got its
    part (``fanout_sink.consistent_read``). None: the round is not a consistent point."""

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "deadline": self.remaining_s()}

    def __setstate__(self, state: dict[str, object]) -> None:
        left = state["deadline"]
        assert isinstance(left, float)
        self.__dict__.update({**state, "deadline": time.monotonic() + left})

    def part(self, identifier: str, location: str | None) -> TablePart:
        """``identifier``'s part of the round, to commit from ``location`` (None: from the catalog)."""
        return TablePart(
            identifier, self.due[identifier], self.round_end, self.commit_id, self.vtts, self.floors,
            location, self.tables, identifier in self.merging,
        )  # fmt: skip

    def only(self, tables: Iterable[str]) -> RoundTables:
        """The same round narrowed to ``tables``."""
        wanted = set(tables)
        return replace(self, due={t: items for t, items in self.due.items() if t in wanted})

    def split(self, shares: int) -> list[RoundTables]:
        """At most ``shares`` non-empty shares of the round's tables, of about equal file counts
        (largest tables first, each to the lightest share), so that no share waits on a few heavy
        tables of another's."""
        parts: list[dict[str, list[PendingFiles]]] = [{} for _ in range(max(1, min(shares, len(self.due))))]
        weights = [0] * len(parts)
        for table, items in sorted(self.due.items(), key=lambda kv: -_files(kv[1])):
            lightest = weights.index(min(weights))
            parts[lightest][table] = items
            weights[lightest] += _files(items)
        return [replace(self, due=dict(sorted(part.items()))) for part in parts if part]


def _files(items: list[PendingFiles]) -> int:
    return sum(len(p.event.files) for p in items) or 1


class TableCommitRunner(Protocol):
    """Runs a round's table commits; returns an outcome per table it got to (a missing one is failed)."""

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]: ...


def outcomes(runner: TableCommitRunner, tables: RoundTables) -> dict[str, TableCommit]:
    """An outcome for every table of ``tables`` from ``runner``: a runner that fails as a whole fails
    its tables, not the round, and a table it gave no outcome for is ``failed`` (left pending: if its
    commit landed after all, the next round's re-check skips it)."""
    try:
        results = runner(tables)
    except Exception as exc:
        log.warning("table commits of round %s failed", tables.commit_id, exc_info=True)
        results = {t: TableCommit(t, "failed", error=repr(exc)) for t in tables.due}
    return {t: results.get(t) or TableCommit(t, "failed", error="no outcome") for t in tables.due}


def commit_in_threads(committer: TableCommitter, tables: RoundTables, threads: int) -> dict[str, TableCommit]:
    """Every table of ``tables`` committed by ``committer`` on up to ``threads`` threads of this
    process; a table not done by the deadline, or whose commit raised, is ``failed``."""
    if not tables.due:
        return {}
    results: dict[str, TableCommit] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="table-commit")
    try:
        try:
            locations = committer.locate(tables.due)
        except Exception:  # each commit then asks the catalog itself, as it would on any catalog
            log.warning(
                "reading the round's table pointers failed: each table is loaded on its own", exc_info=True
            )
            locations = {}
        if committer.stages and len(tables.due) >= GROUP_MIN_TABLES:
            return _commit_in_groups(committer, tables, pool, locations)
        futures = {
            identifier: pool.submit(committer.commit_part, tables.part(identifier, locations.get(identifier)))
            for identifier in tables.due
        }
        for identifier, future in futures.items():
            try:
                results[identifier] = future.result(timeout=tables.remaining_s())
            except FutureTimeout:
                # Left pending: if the commit lands later, the next round's re-check skips it.
                results[identifier] = TableCommit(identifier, "failed", error="commit timeout")
            except Exception as exc:
                # The traceback once, when the table starts failing; the coordinator's ERROR every round.
                if identifier not in tables.failing:
                    log.warning("commit of %s failed", identifier, exc_info=True, extra={"table": identifier})
                results[identifier] = TableCommit(identifier, "failed", error=repr(exc))
    finally:
        # Do not wait for a commit that timed out: the round goes on without it.
        pool.shutdown(wait=False, cancel_futures=True)
    return results


GROUP_MIN_TABLES = 4
"""A round (or share) of fewer tables commits table by table, each in its own catalog transaction."""
GROUP_TABLES = 50
"""At most this many staged commits land in one catalog transaction (fewer when no more are staging)."""


def _stage(
    committer: TableCommitter, tables: RoundTables, identifier: str, location: str | None
) -> tuple[TableCommit | StagedCommit, list[str]]:
    """``identifier``'s commit staged on this thread with its files' fsyncs deferred: the stage, and
    the paths to fsync before anything names them."""
    paths: list[str] = []
    with durable_io.syncs_deferred(paths):
        staged = committer.stage(tables.part(identifier, location))
    return staged, paths


def _commit_alone(
    committer: TableCommitter, tables: RoundTables, identifier: str
) -> tuple[TableCommit | StagedCommit, list[str]]:
    """``identifier`` committed on its own, loaded from the catalog again: its staged commit met a
    pointer moved since, so its floor is checked again on the metadata the catalog holds now (I3)."""
    commit = committer.commit_part(tables.part(identifier, None))
    return commit, []


def _commit_in_groups(
    committer: TableCommitter, tables: RoundTables, pool: ThreadPoolExecutor, locations: dict[str, str]
) -> dict[str, TableCommit]:
    """The round's tables staged on ``pool``'s threads, and landed in groups as they are staged.

    A table's commit, one at a time, ended in its own catalog transaction and fsynced its manifest,
    manifest list and metadata file as each closed: on SQLite 60 % of a commit's wall time was its
    threads queued for the database's one write lock and its journal's fsyncs, 28 % the files'
    fsyncs (docs/benchmarks/wide-sinks.md, "Table commits in groups"). Here the files are written with
    their fsyncs deferred; whenever :data:`GROUP_TABLES` tables are staged (or no more are staging)
    their files are fsynced together (:func:`~fanout_sink.durable_io.fsync_all`), and only then their
    pointers are swapped in one transaction (:meth:`TableCommitter.swap`), while the threads stage the
    next tables. A pointer found moved (someone committed since the round read it) leaves its table
    out of the swap: it is committed on its own, reloaded and re-checked, as a conflict always was.
    A kill before the swap leaves the group's files orphaned and nothing committed; after it, every
    table of the group holds its floor, and the next round finds it there (I4)."""
    results: dict[str, TableCommit] = {}
    running = {pool.submit(_stage, committer, tables, t, locations.get(t)): t for t in tables.due}
    staging = set(running)
    staged: list[StagedCommit] = []
    settled: dict[str, TableCommit] = {}
    paths: list[str] = []

    def land(retry: bool) -> None:
        """fsync what the tables taken so far wrote, then swap the staged ones' pointers."""
        try:
            durable_io.fsync_all(paths)
        except OSError as exc:  # nothing may name them: the group's tables fail and stay pending
            failed = [s.outcome.identifier for s in staged] + list(settled)
            results.update({t: TableCommit(t, "failed", error=repr(exc)) for t in failed})
            staged.clear()
            settled.clear()
            paths.clear()
            return
        paths.clear()
        results.update(settled)
        settled.clear()
        if not staged:
            return
        fault_point("coordinator.before-pointer-swap", tables=len(staged), catalog=committer.catalog)
        try:
            landed = committer.swap(staged)
        except Exception:  # rolled back: every table is committed alone, which re-checks its floor
            log.warning(
                "swapping %d table pointers failed: each is committed alone", len(staged), exc_info=True
            )
            landed = set()
        for commit in staged:
            identifier = commit.outcome.identifier
            if identifier in landed:
                fault_point("coordinator.after-table-commit", table=identifier)
                results[identifier] = commit.outcome
            elif retry:
                log.warning(
                    "commit of %s conflicted (its pointer moved): reloading and re-checking", identifier
                )
                running[pool.submit(_commit_alone, committer, tables, identifier)] = identifier
            else:
                results[identifier] = TableCommit(
                    identifier, "failed", error="conflict at the commit timeout"
                )
        staged.clear()

    while running:
        done, _ = wait(running, timeout=tables.remaining_s(), return_when=FIRST_COMPLETED)
        if not done:
            break
        for future in done:
            identifier = running.pop(future)
            staging.discard(future)
            try:
                outcome, written = future.result()
            except CommitFailedException:  # its staging met a requirement the table no longer holds
                running[pool.submit(_commit_alone, committer, tables, identifier)] = identifier
                continue
            except Exception as exc:
                if identifier not in tables.failing:
                    log.warning("commit of %s failed", identifier, exc_info=True, extra={"table": identifier})
                outcome, written = TableCommit(identifier, "failed", error=repr(exc)), []
            paths += written
            if isinstance(outcome, StagedCommit):
                staged.append(outcome)
            else:
                settled[identifier] = outcome
        if len(staged) >= GROUP_TABLES or not staging:
            land(retry=True)
    land(retry=False)  # what was staged by the deadline lands; a conflict has no time left
    for identifier in running.values():
        # Left pending: if a commit lands later, the next round's re-check skips it.
        results[identifier] = TableCommit(identifier, "failed", error="commit timeout")
    return results


@dataclass(frozen=True)
class ThreadedCommits:
    """The default runner: the coordinator's own committer on a few threads of its process (the
    commits wait on the catalog and on storage, but their CPU shares the process's one GIL)."""

    committer: TableCommitter
    threads: int = 4

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        return commit_in_threads(self.committer, tables, self.threads)
