"""The side-by-side benchmark's results: kept as JSON, rendered as markdown, a PNG chart and targets.

Every invocation merges its measurements into ``results.json`` (a run with ``--cores 1`` or
``--latency`` adds to, not replaces, the others), then the markdown and the chart are rendered
from all of it, so one file always shows the latest of each measurement.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.process_cpu import ROLES

STANDARD_RECORDS = 1_000_000
"""The issue's standard run size: the targets read it when a larger run (10M) was measured as well."""
OURS_BATCH = "fanout_sink available-now"
OURS_CONTINUOUS = "fanout_sink continuous"
CONNECT = "Iceberg Kafka Connect sink"
LIMIT = "in-process limit"


@dataclass(frozen=True)
class Measurement:
    """One system, variant and round: the raw figures a row of the table is computed from."""

    cores: int
    variant: str
    round: int
    system: str
    records: int
    megabytes: float
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    worker_rss_mb: float | None
    steady_s: float | None
    files_per_table: list[int]
    snapshots_per_table: list[int]
    pss_mb: float | None = None
    role_rss_mb: dict[str, float] = field(default_factory=dict)
    """Per process kind (driver JVM, driver Python, Python workers), its peak summed RSS."""
    role_processes: dict[str, int] = field(default_factory=dict)
    """Per process kind, the most processes of it alive at once."""
    role_cpu_s: dict[str, float] = field(default_factory=dict)
    """Per process kind, its CPU seconds over the run (start-up included)."""
    taskset: str | None = None  # the CPUs the tree was pinned to (``taskset -c``), None: unpinned
    first_commit_s: float | None = None
    """Seconds from the system's start to its first table commit."""
    max_commit_gap_s: float | None = None
    """The longest any table went between two of its commits (None: no table committed twice)."""


@dataclass(frozen=True)
class Summary:
    """Medians and spreads of one (cores, variant, system, pinning, records) over its rounds."""

    cores: int
    variant: str
    system: str
    rounds: int
    rate: tuple[float, float, float]  # median, min, max records/s (wall)
    mb_rate: tuple[float, float, float]
    steady_rate: float | None
    cpu_per_million: float
    peak_rss_mb: float
    worker_rss_mb: float | None
    files: tuple[int, int]
    snapshots: tuple[int, int]
    pss_mb: float | None = None
    role_rss_mb: dict[str, float] = field(default_factory=dict)
    role_processes: dict[str, int] = field(default_factory=dict)
    role_cpu_s: dict[str, float] = field(default_factory=dict)
    taskset: str | None = None
    records: int = STANDARD_RECORDS


def pinned_cpus(taskset: str) -> int:
    """How many CPUs a ``taskset -c`` list names: ``0`` is 1, ``0-1`` is 2, ``0,2-3`` is 3."""
    count = 0
    for part in taskset.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarise(measurements: Iterable[Measurement]) -> list[Summary]:
    groups: dict[tuple[int, str, str, str | None, int], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.cores, m.variant, m.system, m.taskset, m.records), []).append(m)
    out = []
    for (cores, variant, system, taskset, records), ms in groups.items():
        steady = [m.records / m.steady_s for m in ms if m.steady_s]
        workers = [m.worker_rss_mb for m in ms if m.worker_rss_mb]
        pss = [m.pss_mb for m in ms if m.pss_mb]
        kinds = sorted({kind for m in ms for kind in m.role_rss_mb})
        cpu_kinds = sorted({kind for m in ms for kind in m.role_cpu_s})
        out.append(
            Summary(
                cores=cores,
                variant=variant,
                system=system,
                rounds=len(ms),
                rate=_spread([m.records / m.wall_s for m in ms]),
                mb_rate=_spread([m.megabytes / m.wall_s for m in ms]),
                steady_rate=statistics.median(steady) if steady else None,
                cpu_per_million=statistics.median(m.cpu_s * 1e6 / m.records for m in ms),
                peak_rss_mb=statistics.median(m.peak_rss_mb for m in ms),
                worker_rss_mb=max(workers) if workers else None,
                files=(min(min(m.files_per_table) for m in ms), max(max(m.files_per_table) for m in ms)),
                snapshots=(
                    min(min(m.snapshots_per_table) for m in ms),
                    max(max(m.snapshots_per_table) for m in ms),
                ),
                pss_mb=statistics.median(pss) if pss else None,
                role_rss_mb={k: statistics.median(m.role_rss_mb.get(k, 0.0) for m in ms) for k in kinds},
                role_processes={k: max(m.role_processes.get(k, 0) for m in ms) for k in kinds},
                role_cpu_s={k: statistics.median(m.role_cpu_s.get(k, 0.0) for m in ms) for k in cpu_kinds},
                taskset=taskset,
                records=records,
            )
        )
    return out


def merge(path: Path, key: str, update: Callable[[Any], Any]) -> dict[str, Any]:
    """Read ``path`` (JSON), replace ``data[key]`` with ``update(old value)``, write it back."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    data[key] = update(data.get(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def merge_measurements(old: list[dict[str, Any]] | None, new: list[Measurement]) -> list[dict[str, Any]]:
    """Old measurements, minus those of a (cores, variant, system, pinning, records) measured anew, plus
    the new ones: a 10M-record run sits beside the 1M one."""
    fresh = {(m.cores, m.variant, m.system, m.taskset, m.records) for m in new}
    kept = [
        m
        for m in old or []
        if (m["cores"], m["variant"], m["system"], m.get("taskset"), m["records"]) not in fresh
    ]
    return kept + [asdict(m) for m in new]


def _range(values: tuple[int, int]) -> str:
    return str(values[0]) if values[0] == values[1] else f"{values[0]}-{values[1]}"


def _table(summaries: list[Summary]) -> list[str]:
    lines = [
        "| cores | pinned CPUs | records | variant | system | records/s (median, min-max) | MB/s | "
        "steady records/s | CPU s per 1M | peak RSS tree MB | largest worker MB | files/table | "
        "snapshots/table |",
        "|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sorted(summaries, key=lambda s: (-s.cores, s.taskset or "", s.records, s.variant, s.system)):
        steady = f"{s.steady_rate:,.0f}" if s.steady_rate else ""
        worker = f"{s.worker_rss_mb:,.0f}" if s.worker_rss_mb else ""
        lines.append(
            f"| {s.cores} | {s.taskset or ''} | {s.records:,} | {s.variant} | {s.system} "
            f"| {s.rate[0]:,.0f} ({s.rate[1]:,.0f}-{s.rate[2]:,.0f}) "
            f"| {s.mb_rate[0]:.1f} | {steady} | {s.cpu_per_million:.0f} | {s.peak_rss_mb:,.0f} | {worker} "
            f"| {_range(s.files)} | {_range(s.snapshots)} |"
        )
    return lines


def _memory_table(summaries: list[Summary]) -> list[str]:
    """Peak RSS per process kind (each kind's processes summed at one sample; the kinds peak at
    different moments, so they add up to more than the tree's peak) and the tree's PSS."""
    measured = [s for s in summaries if s.role_rss_mb]
    if not measured:
        return []
    kinds = [k for k in ROLES if any(k in s.role_rss_mb for s in measured)]
    lines = [
        "## Memory by process kind",
        "",
        "Peak RSS of each kind of process (its processes summed at one sample; `n x` is the most alive "
        "at once) and the tree's peak PSS, which counts a page shared by forked workers once.",
        "",
        "| cores | variant | system | peak RSS tree MB | peak PSS tree MB | "
        + " | ".join(f"{k} MB" for k in kinds)
        + " |",
        "|---:|---|---|---:|---:|" + "---:|" * len(kinds),
    ]
    for s in sorted(measured, key=lambda s: (-s.cores, s.taskset or "", s.variant, s.system)):
        cells = [
            f"{s.role_processes.get(k, 0)} x {s.role_rss_mb[k]:,.0f}" if k in s.role_rss_mb else ""
            for k in kinds
        ]
        pss = f"{s.pss_mb:,.0f}" if s.pss_mb else ""
        pinned = f" (taskset {s.taskset})" if s.taskset else ""
        pinned += f" ({s.records:,} records)" if s.records != STANDARD_RECORDS else ""
        lines.append(
            f"| {s.cores} | {s.variant} | {s.system}{pinned} | {s.peak_rss_mb:,.0f} | {pss} | "
            + " | ".join(cells)
            + " |"
        )
    return [*lines, ""]


def _cpu_trend_table(summaries: list[Summary]) -> list[str]:
    """CPU per process kind at each measured size and, where a system ran at two sizes or more, the
    least-squares line through them: the fixed seconds (start-up, planning, the last commit) and the
    seconds per 1M records, so the trend with N shows which costs a longer run pays down."""
    measured = [s for s in summaries if s.role_cpu_s and s.taskset is None]
    if not measured:
        return []
    kinds = [k for k in ROLES if any(s.role_cpu_s.get(k, 0.0) >= 0.05 for s in measured)]
    lines = [
        "## CPU by process kind, fixed and per record",
        "",
        "CPU seconds of each kind of process over the whole run (start-up included), then, per system "
        "measured at two sizes or more, the line through them: fixed CPU s + CPU s per 1M records.",
        "",
        "| cores | variant | system | records | tree CPU s | "
        + " | ".join(f"{k} CPU s" for k in kinds)
        + " |",
        "|---:|---|---|---:|---:|" + "---:|" * len(kinds),
    ]
    groups: dict[tuple[int, str, str], list[Summary]] = {}
    for s in sorted(measured, key=lambda s: (-s.cores, s.variant, s.system, s.records)):
        groups.setdefault((s.cores, s.variant, s.system), []).append(s)
        tree = s.cpu_per_million * s.records / 1e6
        cells = [f"{s.role_cpu_s[k]:,.1f}" if s.role_cpu_s.get(k, 0.0) >= 0.05 else "" for k in kinds]
        row = f"| {s.cores} | {s.variant} | {s.system} | {s.records:,} | {tree:,.1f} | "
        lines.append(row + " | ".join(cells) + " |")
    fits = []
    for (cores, variant, system), sizes in groups.items():
        if len({s.records for s in sizes}) < 2:
            continue
        millions = [s.records / 1e6 for s in sizes]
        columns = [[s.cpu_per_million * s.records / 1e6 for s in sizes]]
        columns += [[s.role_cpu_s.get(k, 0.0) for s in sizes] for k in kinds]
        cells = []
        for values in columns:
            fit = statistics.linear_regression(millions, values)
            cells.append(f"{fit.intercept:,.1f} + {fit.slope:,.2f}/1M" if any(values) else "")
        sizes_text = ", ".join(f"{s.records:,}" for s in sizes)
        fits.append(f"| {cores} | {variant} | {system} | {sizes_text} | " + " | ".join(cells) + " |")
    if fits:
        lines += [
            "",
            "| cores | variant | system | from records | tree | " + " | ".join(kinds) + " |",
            "|---:|---|---|---|---:|" + "---:|" * len(kinds),
            *fits,
        ]
    return [*lines, ""]


def _standard_first(found: Iterable[Summary]) -> Summary | None:
    """The run of the standard size among ``found``, else the smallest."""
    return min(found, key=lambda s: (s.records != STANDARD_RECORDS, s.records), default=None)


def _find(
    summaries: list[Summary], cores: int, variant: str, system: str, records: int | None = None
) -> Summary | None:
    """The unpinned summary of (cores, variant, system) of ``records``, or of the standard size."""
    wanted = (cores, variant, system, None)
    return _standard_first(
        s
        for s in summaries
        if (s.cores, s.variant, s.system, s.taskset) == wanted and records in (None, s.records)
    )


def _pinned(summaries: list[Summary], cpus: int, system: str) -> Summary | None:
    """The uniform-3 summary of ``system`` pinned to ``cpus`` CPUs with as many Spark cores / tasks."""
    return _standard_first(
        s
        for s in summaries
        if s.taskset
        and pinned_cpus(s.taskset) == cpus == s.cores
        and (s.variant, s.system) == ("uniform-3", system)
    )


def _target_row(target: str, measured: str | None, met: bool | None) -> str:
    """A targets table's row: the figure, and met, missed or not measured (``met`` is None)."""
    verdict = "not measured" if met is None else ("met" if met else "**missed**")
    return f"| {target} | {measured or ''} | {verdict} |"


def targets(
    summaries: list[Summary],
    latency: dict[str, Any] | None,
    cores: int,
    soak: dict[str, Any] | None = None,
) -> list[str]:
    """One line per target of issue 26, computed from the measured numbers: met, missed or not measured."""
    lines = ["| target | measured | verdict |", "|---|---|---|"]

    def add(target: str, measured: str | None, met: bool | None) -> None:
        lines.append(_target_row(target, measured, met))

    ours, peer = (
        _find(summaries, cores, "uniform-3", OURS_BATCH),
        _find(summaries, cores, "uniform-3", CONNECT),
    )
    if ours and peer:
        ratio = ours.rate[0] / peer.rate[0]
        add("wall records/s >= 3x Connect (uniform-3)", f"{ratio:.2f}x", ratio >= 3)
        cpu = ours.cpu_per_million / peer.cpu_per_million
        add("CPU s per 1M <= 0.5x Connect (uniform-3)", f"{cpu:.2f}x", cpu <= 0.5)
        add(
            "peak RSS <= Connect's, 3 tables",
            f"{ours.peak_rss_mb:,.0f} vs {peer.peak_rss_mb:,.0f} MB",
            ours.peak_rss_mb <= peer.peak_rss_mb,
        )
        for size in sorted({s.records for s in summaries} - {ours.records}):
            big_ours = _find(summaries, cores, "uniform-3", OURS_BATCH, size)
            big_peer = _find(summaries, cores, "uniform-3", CONNECT, size)
            if big_ours and big_peer:
                add(
                    f"peak RSS <= Connect's, 3 tables, {size:,} records",
                    f"{big_ours.peak_rss_mb:,.0f} vs {big_peer.peak_rss_mb:,.0f} MB",
                    big_ours.peak_rss_mb <= big_peer.peak_rss_mb,
                )
    else:
        for target in (
            "wall records/s >= 3x Connect",
            "CPU s per 1M <= 0.5x Connect",
            "peak RSS <= Connect's",
        ):
            add(target, None, None)
    steady = _find(summaries, cores, "uniform-3", OURS_CONTINUOUS)
    limit = _find(summaries, cores, "uniform-3", LIMIT)
    if steady and steady.steady_rate and limit:
        share = steady.steady_rate / limit.rate[0]
        add(
            "continuous steady state >= 45% of the 2-process limit (uniform-3)", f"{share:.0%}", share >= 0.45
        )
    else:
        add("continuous steady state >= 45% of the limit", None, None)
    wide = _find(summaries, cores, "uniform-50", OURS_CONTINUOUS)
    mixed = _find(summaries, cores, "mixed-50", OURS_CONTINUOUS)
    if wide and wide.steady_rate and mixed and mixed.steady_rate:
        share = mixed.steady_rate / wide.steady_rate
        add("mixed-type steady state >= 80% of uniform (50 tables)", f"{share:.0%}", share >= 0.8)
    else:
        add("mixed-type steady state >= 80% of uniform (50 tables)", None, None)
    ours_systems = (OURS_BATCH, OURS_CONTINUOUS)
    workers = [
        s.worker_rss_mb
        for s in summaries
        if s.variant.endswith("-50") and s.system in ours_systems and s.worker_rss_mb
    ]  # fmt: skip
    add(
        "largest Python worker < 1 GB with 50 tables",
        f"{max(workers):,.0f} MB" if workers else None,
        max(workers) < 1024 if workers else None,
    )
    if latency:
        bound = latency["commit_interval_s"] + 3
        add(
            f"produce-to-visible p99 <= commit interval + 3 s ({bound:g} s)",
            f"{latency['p99_s']:.1f} s",
            latency["p99_s"] <= bound,
        )
    else:
        add("produce-to-visible p99 <= commit interval + 3 s", None, None)
    one, two = _pinned(summaries, 1, OURS_CONTINUOUS), _pinned(summaries, 2, OURS_CONTINUOUS)
    if one and two and one.steady_rate and two.steady_rate:
        scale = two.steady_rate / one.steady_rate
        peer_one, peer_two = _pinned(summaries, 1, CONNECT), _pinned(summaries, 2, CONNECT)
        context = (
            f"; Connect {peer_two.rate[0] / peer_one.rate[0]:.2f}x (wall)" if peer_one and peer_two else ""
        )
        add(
            "1 to 2 pinned cores >= 1.8x (continuous steady state, uniform-3, taskset)",
            f"{scale:.2f}x{context}",
            scale >= 1.8,
        )
    else:
        add("1 to 2 pinned cores >= 1.8x (taskset)", None, None)
    if soak:
        minutes = f"{(soak['duration_s'] - soak['warm_up_s']) / 60:.0f} min after warm-up"
        add(
            f"soak: RSS within 10% of its post-warm-up value ({minutes})",
            f"max deviation {soak['rss_max_deviation']:.1%}",
            soak["rss_flat"],
        )
        rows = soak["rows"]
        add(
            "soak: 0 duplicates, 0 losses",
            f"{rows['duplicates']} duplicates, {rows['missing']} missing of {rows['produced']:,}",
            soak["exact"],
        )
        add("soak: lag bounded", f"max {soak['lag_max_s']:.1f} s of production", soak["lag_bounded"])
    else:
        add("soak: RSS within 10% after warm-up; 0 duplicates, 0 losses", None, None)
    return lines


TEN_MILLION = 10_000_000


def targets_at_scale(summaries: list[Summary], cores: int) -> list[str]:
    """One line per target of issue 34 (once start-up no longer counts: 10M records), computed from
    the measured numbers: met, missed or not measured."""
    lines = ["| target | measured | verdict |", "|---|---|---|"]

    def add(target: str, measured: str | None, met: bool | None) -> None:
        lines.append(_target_row(target, measured, met))

    def at(variant: str, system: str, records: int = TEN_MILLION) -> Summary | None:
        return _find(summaries, cores, variant, system, records)

    ours, peer = at("uniform-3", OURS_BATCH), at("uniform-3", CONNECT)
    if ours and peer:
        ratio = ours.rate[0] / peer.rate[0]
        add("10M uniform-3: wall records/s >= 1.5x Connect's", f"{ratio:.2f}x", ratio >= 1.5)
        cpu = ours.cpu_per_million / peer.cpu_per_million
        add(
            "10M uniform-3: CPU s per 1M <= 0.5x Connect's",
            f"{ours.cpu_per_million:.1f} vs {peer.cpu_per_million:.1f} s: {cpu:.2f}x",
            cpu <= 0.5,
        )
    else:
        add("10M uniform-3: wall records/s >= 1.5x, CPU per 1M <= 0.5x Connect's", None, None)
    for records in (STANDARD_RECORDS, TEN_MILLION):
        mine, theirs = at("uniform-3", OURS_BATCH, records), at("uniform-3", CONNECT, records)
        add(
            f"{records:,} uniform-3: peak RSS of the tree <= Connect's",
            f"{mine.peak_rss_mb:,.0f} vs {theirs.peak_rss_mb:,.0f} MB" if mine and theirs else None,
            mine.peak_rss_mb <= theirs.peak_rss_mb if mine and theirs else None,
        )
    limit = at("uniform-3", LIMIT)
    if ours and ours.steady_rate and limit:
        share = ours.steady_rate / limit.rate[0]
        add(
            "10M uniform-3: steady state >= 80% of the 2-process in-process limit",
            f"{ours.steady_rate:,.0f} vs {limit.rate[0]:,.0f} records/s: {share:.0%}",
            share >= 0.8,
        )
    else:
        add("10M uniform-3: steady state >= 80% of the 2-process in-process limit", None, None)
    wide, mixed = at("uniform-50", OURS_BATCH), at("mixed-50", OURS_BATCH)
    if wide and wide.steady_rate and mixed and mixed.steady_rate:
        share = mixed.steady_rate / wide.steady_rate
        add(
            "10M, 50 tables: mixed-type steady state >= 85% of uniform",
            f"{mixed.steady_rate:,.0f} vs {wide.steady_rate:,.0f} records/s: {share:.0%}",
            share >= 0.85,
        )
    else:
        add("10M, 50 tables: mixed-type steady state >= 85% of uniform", None, None)
    return lines


FIFTY_MILLION = 50_000_000
SUSTAINED_SIZES = (TEN_MILLION, FIFTY_MILLION)


def _rounds(
    measurements: list[Measurement], system: str, records: int, variant: str
) -> dict[int, Measurement]:
    return {
        m.round: m
        for m in measurements
        if m.system == system and m.records == records and m.variant == variant and not m.taskset
    }


def targets_sustained(measurements: list[Measurement], commit_interval_s: float) -> list[str]:
    """One line per target of issue 48 (a long backlog at the sink's defaults, two runs per size),
    each run paired with the Connect run of the same round: met only when every pair meets it."""
    lines = ["| target | measured, per run | verdict |", "|---|---|---|"]

    def add(target: str, measured: list[str], met: list[bool]) -> None:
        lines.append(_target_row(target, "; ".join(measured) or None, all(met) if met else None))

    for records in SUSTAINED_SIZES:
        ours = _rounds(measurements, OURS_BATCH, records, "uniform-3")
        peer = _rounds(measurements, CONNECT, records, "uniform-3")
        pairs = [(ours[r], peer[r]) for r in sorted(ours) if r in peer]
        size = f"{records // 1_000_000}M uniform-3"
        rates = [(o.records / o.wall_s) / (c.records / c.wall_s) for o, c in pairs]
        add(
            f"{size}: wall records/s >= 1.3x Connect's",
            [f"{r:.2f}x" for r in rates],
            [r >= 1.3 for r in rates],
        )
        cpu = [o.cpu_s / c.cpu_s for o, c in pairs]
        add(f"{size}: CPU per 1M <= 0.6x Connect's", [f"{r:.2f}x" for r in cpu], [r <= 0.6 for r in cpu])
        add(
            f"{size}: peak RSS <= Connect's",
            [f"{o.peak_rss_mb:,.0f} vs {c.peak_rss_mb:,.0f} MB" for o, c in pairs],
            [o.peak_rss_mb <= c.peak_rss_mb for o, c in pairs],
        )
        gaps = [o.max_commit_gap_s for o in ours.values() if o.first_commit_s is not None]  # measured
        add(
            f"{size}: every table committed at least every 2 commit intervals ({2 * commit_interval_s:g} s)",
            [f"longest gap {g:.1f} s" if g is not None else "one commit only" for g in gaps],
            [g is not None and g <= 2 * commit_interval_s for g in gaps],
        )
    limit = _rounds(measurements, LIMIT, TEN_MILLION, "uniform-3")
    ours10 = _rounds(measurements, OURS_BATCH, TEN_MILLION, "uniform-3")
    best_limit = max((m.records / m.wall_s for m in limit.values()), default=None)
    shares = [o.records / o.steady_s / best_limit for o in ours10.values() if o.steady_s and best_limit]
    add(
        "10M uniform-3: steady state >= 80% of the 2-process in-process limit",
        [f"{s:.0%}" for s in shares],
        [s >= 0.8 for s in shares],
    )
    wide = _rounds(measurements, OURS_BATCH, TEN_MILLION, "uniform-50")
    mixed = _rounds(measurements, OURS_BATCH, TEN_MILLION, "mixed-50")
    mixes = [wide[r].wall_s / mixed[r].wall_s for r in sorted(mixed) if r in wide]
    add(
        "10M, 50 tables: mixed-type wall rate >= 85% of uniform",
        [f"{m:.0%}" for m in mixes],
        [m >= 0.85 for m in mixes],
    )
    return lines


def markdown(data: dict[str, Any]) -> str:
    measurements = [Measurement(**m) for m in data.get("measurements") or []]
    summaries = summarise(measurements)
    machine = data.get("machine", {})
    latency = data.get("latency")
    cores = max((s.cores for s in summaries), default=machine.get("cores", 2))
    lines = [
        "# Side-by-side throughput",
        "",
        "Regenerated by these commands (on a quiet machine), each merging into `results.json`:",
        "",
        *[f"- {what}: `{command}`" for what, command in sorted((data.get("commands") or {}).items())],
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in sorted(machine.items())),
        "",
        "Same generated JSON records for every system, one topic with 2 partitions on the local broker, "
        "each system into a fresh SQLite catalog with the tables created up front. records/s and MB/s are "
        "wall time, start-up included (the in-process limit: the work only); steady = first batch start "
        "to last batch end. CPU and RSS cover the whole process tree (JVM, Python workers). Every "
        "system landed exactly the same ids per table (checked after each run).",
        "",
        *_table(summaries),
        "",
        *_memory_table(summaries),
        *_cpu_trend_table(summaries),
        "## Targets (issue 26)",
        "",
        *targets(summaries, latency, cores, data.get("soak")),
        "",
        "## Targets at scale (issue 34)",
        "",
        "Each miss with its measured reason and what would close it: "
        "[throughput-at-scale.md](throughput-at-scale.md).",
        "",
        *targets_at_scale(summaries, cores),
        "",
        "## Targets of a long backlog (issue 48)",
        "",
        "The sink at its defaults (no `--max-offsets-per-trigger`), both systems at the commit interval "
        "below, two runs per size; each of our runs is paired with Connect's run of the same round. "
        "Analysis: [sustained-throughput.md](sustained-throughput.md).",
        "",
        *targets_sustained(measurements, float(data.get("commit_interval_s", 10.0))),
    ]
    if latency:
        lines += [
            "",
            "## Produce-to-visible latency",
            "",
            f"    {latency['command']}",
            "",
            f"{latency['records']:,} records at {latency['rate']:,.0f} records/s "
            f"for {latency['duration_s']:g} s "
            f"into `{latency['variant']}`, commit interval {latency['commit_interval_s']:g} s: "
            f"p50 {latency['p50_s']:.1f} s, p99 {latency['p99_s']:.1f} s, max {latency['max_s']:.1f} s "
            "(produce call to the timestamp of the first snapshot holding the record).",
        ]
    if soak := data.get("soak"):
        lines += [
            "",
            "## Soak",
            "",
            f"`{soak['command']}`: {soak['records']:,} records over {soak['duration_s']:g} s; the RSS and "
            "lag series, the load average and the output are in [soak.md](soak.md).",
        ]
    return "\n".join(lines) + "\n"


def chart(data: dict[str, Any], path: Path) -> None:
    """Median wall records/s (min-max as error bars) and CPU s per 1M, per variant and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [s for s in summarise(Measurement(**m) for m in data.get("measurements") or [])]
    cores = max((s.cores for s in summaries), default=0)
    summaries = [s for s in summaries if s.cores == cores and s.taskset is None]
    variants = sorted({s.variant for s in summaries})
    systems = sorted({s.system for s in summaries})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8))
    width = 0.8 / max(len(systems), 1)
    for n, system in enumerate(systems):
        found = [_find(summaries, cores, v, system) for v in variants]
        xs = [i + n * width for i in range(len(variants))]
        rates = [s.rate[0] if s else 0 for s in found]
        errors = [
            [s.rate[0] - s.rate[1] if s else 0 for s in found],
            [s.rate[2] - s.rate[0] if s else 0 for s in found],
        ]
        top.bar(xs, rates, width, yerr=errors, label=system, capsize=2)
        bottom.bar(xs, [s.cpu_per_million if s else 0 for s in found], width, label=system)
    for axis, title in ((top, "records/s (wall, median, min-max)"), (bottom, "CPU seconds per 1M records")):
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(variants))], variants)
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
    top.legend(fontsize=8)
    fig.suptitle(f"fanout_sink side by side, {cores} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
