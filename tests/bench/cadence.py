"""Per-table commit cadence on the wide app (issue 50's cadence target): a skewed feed, the hot tables'
routes, and what the tables' snapshots tell about snapshots, files and VTTS age.

The target: "with per-table cadence on a 5,000-table run where 5% of tables carry 90% of records:
snapshots per hour and files per table at least 5x fewer than one cadence for all, the hot tables'
VTTS age unchanged". Two runs of :mod:`bench.wide_app` with the same skew make it measurable: one
without ``--cold-commit-interval`` (every table commits every round) and one with it (the cold
tables take ``dynamic.commit-interval``). Both declare the hot tables under ``tables:`` (a route of
their own without an interval, so they commit every round), so the two runs' configs differ only by
that interval. :func:`compare` sets one run's figures against the other's.

Everything here is read after the run from the tables' snapshots (nothing polls the running sink): a
table's VTTS at a time ``t`` is the one its newest sink snapshot committed at or before ``t`` records,
so its age at ``t`` is ``t`` minus that.
"""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.workload import NAMESPACE, ROUTE_FIELD

SHUFFLE_SEED = 50
_ROUND_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO fanout_sink\.protocol\.coordinator: "
    r"commit \S+ \(([a-z-]+)\): (?:\d+ table\(s\) ([a-z0-9, -]+), \d+ files \([^;]*\); )?"
    r"(?:(\d+) table\(s\) waiting for their commit-interval; )?",
    re.MULTILINE,
)
AGE_STEP_S = 5.0
"""How often over the judged window the tables' VTTS age is read off their snapshots."""
TARGET_RATIO = 5.0
"""The issue's bound: snapshots per hour and files per table at least 5x fewer with the cadence."""
AGE_TOLERANCE = 1.2
""""The hot tables' VTTS age unchanged", judged: median and max at most 1.2x the baseline's."""


@dataclass(frozen=True)
class Skew:
    """The feed's shape: the first ``hot`` of ``tables`` tables get ``hot_each`` records for every one
    a cold table gets, so every table receives data in every cycle of :attr:`cycle` records."""

    tables: int
    hot: int = 0
    hot_each: int = 1

    @classmethod
    def of(cls, tables: int, hot_share: float, hot_records: float) -> Skew:
        """``hot_share`` of the tables carrying ``hot_records`` of the records (0: every table alike)."""
        if hot_share <= 0:
            return cls(tables)
        if not 0 < hot_records < 1:
            raise SystemExit(f"--hot-records {hot_records:g}: a share between 0 and 1, e.g. 0.9")
        hot = max(1, round(tables * hot_share))
        cold = tables - hot
        if cold < 1:
            raise SystemExit(f"--hot-share {hot_share:g} of {tables} tables leaves no cold table; e.g. 0.05")
        return cls(tables, hot, max(1, round(cold * hot_records / ((1 - hot_records) * hot))))

    @property
    def cycle(self) -> int:
        """Records until every table got its share once."""
        return self.hot * self.hot_each + self.tables - self.hot

    @property
    def hot_record_share(self) -> float:
        return self.hot * self.hot_each / self.cycle

    def slots(self) -> list[int]:
        """The partition (= table) of each record of a cycle: record ``n`` goes to ``slots[n % cycle]``.
        Without hot tables ``n % tables`` as ever; with them shuffled once (a fixed seed), so each
        table's records spread over the cycle instead of coming in one burst."""
        out = [p for p in range(self.hot) for _ in range(self.hot_each)] + list(range(self.hot, self.tables))
        if self.hot:
            random.Random(SHUFFLE_SEED).shuffle(out)
        return out

    def hot_tables(self) -> list[str]:
        return [table_name(p) for p in range(self.hot)]

    def routes(self) -> dict[str, dict[str, str]]:
        """The hot tables under ``tables:``: a route of their own (the same field ``dynamic.table``
        reads), no ``commit-interval``, so they commit every round whatever ``dynamic``'s is."""
        return {name: {"when": f"{ROUTE_FIELD} == '{name}'"} for name in self.hot_tables()}


def table_name(partition: int) -> str:
    return f"{NAMESPACE}.t{partition}"


@dataclass(frozen=True)
class Commit:
    """One sink snapshot of a table."""

    at_ms: int
    vtts_ms: int | None
    added_files: int
    commit_id: str | None


@dataclass(frozen=True)
class TableHistory:
    """A table's sink snapshots, oldest first; its live data files at the end; every Parquet file in
    its data folder (what the workers and the merges wrote, the merged originals included)."""

    name: str
    commits: list[Commit]
    live_files: int
    stored_files: int

    def vtts_over(self, times_ms: list[int]) -> list[int | None]:
        """The VTTS the table showed at each of ``times_ms`` (ascending): its newest commit's with a
        VTTS at or before then (None: none yet)."""
        out: list[int | None] = []
        shown, i = None, 0
        for at in times_ms:
            while i < len(self.commits) and self.commits[i].at_ms <= at:
                shown = self.commits[i].vtts_ms if self.commits[i].vtts_ms is not None else shown
                i += 1
            out.append(shown)
        return out


def histories(catalog: Any, tables: list[str]) -> list[TableHistory]:
    """Every table's snapshots with the sink's summary keys (``fanout-sink.<sink>.commit-id``, ``.vtts``)."""
    out = []
    for name in tables:
        table = catalog.load_table(name)
        commits = []
        for snapshot in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
            summary = snapshot.summary
            extra = summary.additional_properties if summary else {}
            commit = next((v for k, v in extra.items() if k.endswith(".commit-id")), None)
            vtts = next((int(v) for k, v in extra.items() if k.endswith(".vtts")), None)
            if commit is not None:
                added = int(extra.get("added-data-files", 0))
                commits.append(Commit(snapshot.timestamp_ms, vtts, added, commit))
        current = table.current_snapshot()
        live = int(current.summary["total-data-files"]) if current and current.summary else 0
        data = Path(urlparse(table.location()).path) / "data"
        stored = sum(1 for _ in data.rglob("*.parquet")) if data.exists() else 0
        out.append(TableHistory(name, commits, live, stored))
    return out


@dataclass(frozen=True)
class CadenceRound:
    """A commit round inside the judged window: its tables, how many hot, when (from producing's
    start) and how long its table commits spanned."""

    tables: int
    hot: int
    first_s: float
    span_s: float


@dataclass(frozen=True)
class Ages:
    """VTTS ages in seconds over a set of tables and the judged window's sample times."""

    median_s: float | None
    max_s: float | None
    samples: int


@dataclass(frozen=True)
class CadenceFacts:
    """What a run's tables show over its judged window (``window_s`` long)."""

    hot_tables: int
    hot_record_share: float
    cold_commit_interval_s: float | None
    window_s: float
    snapshots_per_hour: float
    hot_snapshots_per_hour: float
    cold_snapshots_per_hour: float
    files_per_table_hour: float
    """Data files the snapshots added per table and hour (merged files count, their originals not)."""
    live_files_per_table: float
    """The tables' data files at the end (after the drain), mean per table."""
    stored_files_per_table: float
    """Parquet files in the tables' data folders at the end, mean per table (maintenance's share)."""
    hot_age: Ages
    cold_age: Ages
    rounds: list[CadenceRound]

    @property
    def max_round_tables(self) -> int:
        return max((r.tables for r in self.rounds), default=0)


def _ages(tables: list[TableHistory], times_ms: list[int]) -> Ages:
    ages = [
        (at - vtts) / 1000
        for table in tables
        for at, vtts in zip(times_ms, table.vtts_over(times_ms), strict=True)
        if vtts is not None
    ]
    if not ages:
        return Ages(None, None, 0)
    return Ages(round(statistics.median(ages), 1), round(max(ages), 1), len(ages))


def facts(
    tables: list[TableHistory],
    skew: Skew,
    cold_interval_s: float | None,
    produced_at: float,
    window: tuple[float, float],
) -> CadenceFacts:
    """The figures of the judged ``window`` (seconds from producing's start at ``produced_at``, epoch s)."""
    start_ms, end_ms = (round((produced_at + s) * 1000) for s in window)
    hours = (window[1] - window[0]) / 3600
    hot_names = set(skew.hot_tables())
    hot = [t for t in tables if t.name in hot_names]
    cold = [t for t in tables if t.name not in hot_names]

    def inside(group: list[TableHistory]) -> list[Commit]:
        return [c for t in group for c in t.commits if start_ms <= c.at_ms <= end_ms]

    def per_hour(group: list[TableHistory]) -> float:
        return round(len(inside(group)) / hours, 1) if hours > 0 else 0.0

    stamps = commit_stamps(tables, start_ms, end_ms)
    hot_stamps = commit_stamps(hot, start_ms, end_ms)
    rounds = sorted(
        (
            CadenceRound(
                len(ms),
                len(hot_stamps.get(commit, ())),
                round(min(ms) / 1000 - produced_at, 2),
                (max(ms) - min(ms)) / 1000,
            )
            for commit, ms in stamps.items()
        ),
        key=lambda r: r.first_s,
    )
    step = round(AGE_STEP_S * 1000)
    times = list(range(start_ms, end_ms + 1, step))
    n = max(1, len(tables))
    return CadenceFacts(
        hot_tables=skew.hot,
        hot_record_share=round(skew.hot_record_share, 3),
        cold_commit_interval_s=cold_interval_s,
        window_s=round(window[1] - window[0], 1),
        snapshots_per_hour=per_hour(tables),
        hot_snapshots_per_hour=per_hour(hot),
        cold_snapshots_per_hour=per_hour(cold),
        files_per_table_hour=round(sum(c.added_files for c in inside(tables)) / n / hours, 2)
        if hours
        else 0.0,
        live_files_per_table=round(sum(t.live_files for t in tables) / n, 2),
        stored_files_per_table=round(sum(t.stored_files for t in tables) / n, 2),
        hot_age=_ages(hot, times),
        cold_age=_ages(cold, times),
        rounds=rounds,
    )


def commit_stamps(
    tables: list[TableHistory], start_ms: int = 0, end_ms: int | None = None
) -> dict[str, list[int]]:
    """The tables' commit times (epoch ms) from ``start_ms`` to ``end_ms`` per commit id (per round)."""
    stamps: dict[str, list[int]] = {}
    for table in tables:
        for c in table.commits:
            if c.commit_id is not None and start_ms <= c.at_ms and (end_ms is None or c.at_ms <= end_ms):
                stamps.setdefault(c.commit_id, []).append(c.at_ms)
    return stamps


@dataclass(frozen=True)
class RoundLine:
    """One commit round as the coordinator logged it: when it ended (epoch s), why it ran, its tables
    per outcome and how many waited."""

    at: float
    reason: str
    outcomes: dict[str, int]
    waiting: int

    @property
    def failed(self) -> int:
        return self.outcomes.get("failed", 0)


def round_lines(log: str) -> list[RoundLine]:
    """Every commit round the app's log has a line for (``round_words.round_line``)."""
    out = []
    for stamp, reason, told, waiting in _ROUND_LINE.findall(log):
        outcomes = {}
        for part in filter(None, told.split(", ")):
            count, outcome = part.split(" ", 1)
            outcomes[outcome] = int(count)
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append(RoundLine(at, reason, outcomes, int(waiting or 0)))
    return out


def report(cadence: CadenceFacts, interval_s: float, logged: list[RoundLine]) -> list[str]:
    """Markdown table rows of one run's cadence figures (:func:`.wide_app.report` adds them), with
    the rounds the app logged (``logged``): those with failed tables are cut at the commit timeout."""
    spans = [r.span_s for r in cadence.rounds]
    failed = [r.failed for r in logged if r.failed]
    cold = (
        "one cadence for all"
        if cadence.cold_commit_interval_s is None
        else f"{cadence.cold_commit_interval_s:g} s"
    )
    return [
        f"| hot tables, their records; cold tables' commit interval | {cadence.hot_tables:,}, "
        f"{cadence.hot_record_share:.1%}; {cold} |",
        f"| snapshots per hour over the judged {cadence.window_s:.0f} s: all, hot, cold | "
        f"{cadence.snapshots_per_hour:,.0f}, {cadence.hot_snapshots_per_hour:,.0f}, "
        f"{cadence.cold_snapshots_per_hour:,.0f} |",
        f"| data files per table: added per hour, live at the end, in storage at the end | "
        f"{cadence.files_per_table_hour:,.2f}, {cadence.live_files_per_table:,.2f}, "
        f"{cadence.stored_files_per_table:,.2f} |",
        f"| VTTS age s, hot tables: median, max | {_age(cadence.hot_age)} |",
        f"| VTTS age s, cold tables: median, max | {_age(cadence.cold_age)} |",
        f"| commit rounds in the judged window | {len(cadence.rounds)}; tables per round max "
        f"{cadence.max_round_tables:,}, hot tables per round min "
        f"{min((r.hot for r in cadence.rounds), default=0):,}; spans max {max(spans, default=0):.1f} s, "
        f"over the {interval_s:g} s interval: {sum(1 for s in spans if s > interval_s)} |",
        f"| commit rounds logged (the whole run) | {len(logged)}; with failed tables: {len(failed)} (at most "
        f"{max(failed, default=0):,} failed); tables waiting max "
        f"{max((r.waiting for r in logged), default=0):,} |",
    ]


def _age(ages: Ages) -> str:
    if ages.median_s is None or ages.max_s is None:
        return "-"
    return f"{ages.median_s:,.1f}, {ages.max_s:,.1f} ({ages.samples:,} samples)"


def compare(base: dict[str, Any], cadence: dict[str, Any]) -> str:
    """The target judged from two runs' JSON figures (``WideAppResult.to_json``): without and with
    ``--cold-commit-interval``, the same skew."""
    b, c = base["cadence"], cadence["cadence"]

    def ratio(key: str) -> float | None:
        return None if not c[key] else b[key] / c[key]

    snapshots, files = ratio("snapshots_per_hour"), ratio("files_per_table_hour")
    live = ratio("live_files_per_table")
    hot_b, hot_c = b["hot_age"], c["hot_age"]
    unchanged = all(
        hot_b[k] is not None and hot_c[k] is not None and hot_c[k] <= AGE_TOLERANCE * hot_b[k]
        for k in ("median_s", "max_s")
    )

    def met(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}x: {'met' if value >= TARGET_RATIO else '**NOT met**'}"

    return "\n".join(
        [
            "| target | one cadence for all | cadence | fewer by (at least 5x) |",
            "|---|---:|---:|---|",
            f"| snapshots per hour | {b['snapshots_per_hour']:,.0f} | {c['snapshots_per_hour']:,.0f} | "
            f"{met(snapshots)} |",
            f"| data files added per table and hour | {b['files_per_table_hour']:,.2f} | "
            f"{c['files_per_table_hour']:,.2f} | {met(files)} |",
            f"| live data files per table at the end | {b['live_files_per_table']:,.2f} | "
            f"{c['live_files_per_table']:,.2f} | {'-' if live is None else f'{live:.2f}x'} |",
            f"| hot tables' VTTS age s, median / max (at most {AGE_TOLERANCE:g}x) | {hot_b['median_s']} / "
            f"{hot_b['max_s']} | {hot_c['median_s']} / {hot_c['max_s']} | "
            f"{'unchanged: met' if unchanged else '**changed: NOT met**'} |",
            f"| cold tables' VTTS age s, median / max | {b['cold_age']['median_s']} / "
            f"{b['cold_age']['max_s']} | "
            f"{c['cold_age']['median_s']} / {c['cold_age']['max_s']} | - |",
        ]
    )
