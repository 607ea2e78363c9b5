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
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Protocol

from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.table_commit import TableCommit, TableCommitter

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
        futures = {
            identifier: pool.submit(
                committer.commit,
                identifier,
                items,
                tables.round_end,
                tables.commit_id,
                tables.vtts,
                tables.floors,
                locations.get(identifier),
                tables.tables,
                identifier in tables.merging,
            )
            for identifier, items in tables.due.items()
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


@dataclass(frozen=True)
class ThreadedCommits:
    """The default runner: the coordinator's own committer on a few threads of its process (the
    commits wait on the catalog and on storage, but their CPU shares the process's one GIL)."""

    committer: TableCommitter
    threads: int = 4

    def __call__(self, tables: RoundTables) -> dict[str, TableCommit]:
        return commit_in_threads(self.committer, tables, self.threads)
