"""A commit round as one line in words, however many tables it touched: what the coordinator logs per
round (and the app for its final one).

The line names the round (commit id and why it ran), counts the tables per outcome and their files,
names at most :data:`TABLES_NAMED` tables (the ones not committed first: those are the news), and
gives the VTTS as a UTC time instead of epoch milliseconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime

from fanout_sink.protocol.table_commit import TableCommit

TABLES_NAMED = 10
"""A round line names at most this many tables; the metrics and ``status`` have every one."""


def vtts_words(vtts_ms: int | None) -> str:
    """The VTTS as ISO 8601 UTC to the millisecond, or that the round has none."""
    if vtts_ms is None:
        return "no vtts"
    stamp = datetime.fromtimestamp(vtts_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return "vtts " + stamp.replace("+00:00", "Z")


def tally(tables: Mapping[str, TableCommit]) -> tuple[str, int]:
    """The tables per outcome in words (``12 committed, 1 failed``) and their files in all: what the
    round's line and the app's line about its final round both say."""
    counts = Counter(outcome.outcome for outcome in tables.values())
    told = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
    return told, sum(outcome.files for outcome in tables.values())


def round_line(
    commit_id: str, reason: str, tables: Mapping[str, TableCommit], vtts_ms: int | None, waiting: int = 0
) -> str:
    """``commit <id> (<reason>): <n> tables <outcome>, ..., <files> files (<table> <outcome> (<files>
    files), ...); [<w> waiting for their commit-interval; ]vtts <time>``."""
    told, files = tally(tables)
    shown = sorted(tables.values(), key=lambda c: (c.outcome == "committed", c.identifier))
    named = [f"{c.identifier} {c.outcome} ({c.files} files)" for c in shown[:TABLES_NAMED]]
    if len(shown) > TABLES_NAMED:
        named.append(f"{len(shown) - TABLES_NAMED} more")
    parts = [f"{len(tables)} table(s) {told}, {files} files ({', '.join(named)})"] if tables else []
    if waiting:
        parts.append(f"{waiting} table(s) waiting for their commit-interval")
    return f"commit {commit_id} ({reason}): {'; '.join([*parts, vtts_words(vtts_ms)])}"
