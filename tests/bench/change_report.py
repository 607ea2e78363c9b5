"""The change benchmark's results: one JSON document per run, rendered as markdown with its targets.

The JSON keeps every raw figure (``changes.json``); the markdown (``changes.md``) is rendered from
it alone, so a kept JSON can be rendered again. A system whose table did not match the model key
by key shows its mismatch counts and examples in the table and under "Key by key", and no target
is called met on its figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.change_state import Replica, StateCheck
from bench.proctree import ChildRun

OURS = "fanout_sink available-now"


@dataclass(frozen=True)
class Round:
    """One run of a system: its process tree's figures and its start-up (launch to first batch)."""

    run: ChildRun
    startup_s: float | None

    def working_rate(self, events: int) -> float | None:
        """Change events per second after start-up: the stream's work, the final commit included."""
        if self.startup_s is None or self.run.wall_s <= self.startup_s:
            return None
        return events / (self.run.wall_s - self.startup_s)

    def startup_text(self) -> str:
        return "start-up not in its log" if self.startup_s is None else f"{self.startup_s:.1f} s start-up"


@dataclass(frozen=True)
class SystemResult:
    """One system's rounds over the stream, its last table measured, the earlier ones checked."""

    system: str
    rounds: list[Round]
    replica: Replica
    earlier: list[StateCheck]
    """The key-by-key check of every round's table but the last (that one is in ``replica``)."""

    @property
    def mismatches(self) -> int:
        checks = [*self.earlier, self.replica.check, self.replica.after_check]
        return sum(check.mismatches for check in checks)

    def to_json(self, events: int) -> dict[str, Any]:
        runs = [r.run for r in self.rounds]
        rates = [events / run.wall_s for run in runs]
        working = [rate for r in self.rounds if (rate := r.working_rate(events)) is not None]
        return {
            "system": self.system,
            "rounds": [
                {
                    "wall_s": round(r.run.wall_s, 3),
                    "startup_s": None if r.startup_s is None else round(r.startup_s, 3),
                    "cpu_s": round(r.run.cpu_s, 3),
                    "peak_rss_mb": round(r.run.peak_rss_mb, 1),
                }
                for r in self.rounds
            ],
            "events_per_s": round(statistics.median(rates), 1),
            "events_per_s_range": [round(min(rates), 1), round(max(rates), 1)],
            "working_events_per_s": round(statistics.median(working), 1) if working else None,
            "cpu_s_per_million": round(statistics.median(r.cpu_s * 1e6 / events for r in runs), 2),
            "peak_rss_mb": round(statistics.median(r.peak_rss_mb for r in runs), 1),
            "earlier_mismatches": [check.mismatches for check in self.earlier],
            **self.replica.to_json(),
        }


def _mismatches(check: dict[str, Any]) -> str:
    if not check["mismatches"]:
        return "0"
    parts = [f"{check[k]:,} {k}" for k in ("missing", "extra", "duplicated", "differing") if check[k]]
    return f"**{check['mismatches']:,}** ({', '.join(parts)})"


def _rate(s: dict[str, Any]) -> str:
    low, high = s["events_per_s_range"]
    median = f"{s['events_per_s']:,.0f}"
    return median if len(s["rounds"]) < 2 else f"{median} ({low:,.0f}-{high:,.0f})"


def _files(cost: dict[str, Any]) -> str:
    files = cost["files"]
    return f"{files['data_files']} / {files['delete_files']} ({files['position_deletes']:,})"


def _table(systems: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| system | change events/s | after start-up | CPU s per 1M | peak RSS tree MB | snapshots | "
        "data / delete files (position deletes) after the stream | after maintenance | "
        "PyIceberg full scan s before → after | Spark SQL count s before → after | maintenance s | "
        "key mismatches before / after maintenance |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in systems:
        before, after = s["before"], s["after"]
        working = f"{s['working_events_per_s']:,.0f}" if s.get("working_events_per_s") else ""
        lines.append(
            f"| {s['system']} | {_rate(s)} | {working} | {s['cpu_s_per_million']:,.1f} | "
            f"{s['peak_rss_mb']:,.0f} | {before['files']['snapshots']} | {_files(before)} | "
            f"{_files(after)} | "
            f"{before['pyiceberg_scan_s']:.3f} → {after['pyiceberg_scan_s']:.3f} | "
            f"{before['spark_count_s']:.3f} → {after['spark_count_s']:.3f} | {s['maintenance_s']:.1f} | "
            f"{_mismatches(s['check'])} / {_mismatches(s['after_check'])} |"
        )
    return lines


def targets(systems: list[dict[str, Any]]) -> list[str]:
    """Issue 23's targets, computed from the figures: met, missed, or not measured (no verdict is
    given on a system whose table did not match the model)."""
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    by_name = {s["system"]: s for s in systems}
    ours = by_name.get(OURS)
    peer = next((s for s in systems if s["system"] != OURS), None)

    def add(target: str, measured: str | None, met: bool | None) -> None:
        verdict = "not measured" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {target} | {measured or ''} | {verdict} |")

    def correct(s: dict[str, Any] | None) -> bool:
        return (
            s is not None
            and not any(s["earlier_mismatches"])
            and all(
                s[check]["mismatches"] == 0 and s[cost]["spark_rows"] == s[check]["expected"]
                for check, cost in (("check", "before"), ("after_check", "after"))
            )
        )

    if ours and peer and correct(ours) and correct(peer):
        ratio = ours["events_per_s"] / peer["events_per_s"]
        add(f"change events/s >= 2x {peer['system']}", f"{ratio:.2f}x", ratio >= 2)
        if ours.get("working_events_per_s") and peer.get("working_events_per_s"):
            working = ours["working_events_per_s"] / peer["working_events_per_s"]
            add("the same after start-up (launch to first batch left out)", f"{working:.2f}x", working >= 2)
    else:
        add("change events/s >= 2x the peer", None, None)
    if ours and correct(ours):
        before, after = ours["before"]["pyiceberg_scan_s"], ours["after"]["pyiceberg_scan_s"]
        add(
            "PyIceberg full scan before maintenance <= 2x after",
            f"{before:.3f} s vs {after:.3f} s ({before / after:.2f}x)",
            before <= 2 * after,
        )
        remaining = ours["after"]["files"]["delete_files"]
        add(
            "after maintenance: no delete files left (the scan reads the compacted rows)",
            str(remaining),
            remaining == 0,
        )
    else:
        add("PyIceberg full scan before maintenance <= 2x after", None, None)
        add("after maintenance: no delete files left", None, None)
    return lines


def markdown(data: dict[str, Any]) -> str:
    plan, ops = data["plan"], data["ops"]
    events = sum(ops.values())
    systems = data["systems"]
    lines = [
        "# Change stream side by side: Debezium CDC into Iceberg",
        "",
        f"Regenerated by `{data['command']}`; compare runs on a quiet machine (the load at start is below).",
        "",
        "Machine: "
        + ", ".join(f"{k} {v}" for k, v in sorted(data.get("machine", {}).items()))
        + (f"; load average {data['load_average']:g} when the run started" if "load_average" in data else ""),
        "",
        f"A source table of {plan['keys']:,} keys, loaded into each system's table before the stream "
        f"(format v2, merge-on-read, `id` its identifier field), then {events:,} Debezium change events "
        f"(plain JSON, PostgreSQL connector shape, 8 columns incl. a `timestamptz` and a decimal amount): "
        + ", ".join(f"{ops[op]:,} `{op}`" for op in ("u", "c", "d"))
        + f" (seed {plan['seed']}; drawn {plan['updates']:.0%} updates / {plan['inserts']:.0%} inserts / "
        f"{plan['deletes']:.0%} deletes; a draw on a key deleted by then is drawn again, what is left "
        "becomes a re-insert). Keyed by "
        f"id on one topic with 2 partitions, produced once ({data['produce_s']:.1f} s); each system reads "
        "it all with an available-now trigger into a fresh SQLite catalog.",
        "",
        f"{data['rounds']} rounds per system, the order rotated per round; change events/s is the median "
        "(min-max) of their wall times, Spark start-up included (after start-up: from each system's first "
        "batch to its exit, the last commit included), and the last round's table is measured; "
        "CPU (median per 1M changes) and peak RSS (median) cover the whole process tree (JVM, Python "
        "workers). Files are the current snapshot's. Scan times are medians of "
        f"{data['repeat']} runs of a PyIceberg `scan().to_arrow()` and a Spark SQL `count(*)`. Maintenance: "
        "`rewrite_data_files` with `delete-file-threshold=1` and `remove-dangling-deletes`, then "
        "`rewrite_position_delete_files` with `rewrite-all`. Every round's table is compared key by key "
        "with the model (the stream replayed), the last one again after maintenance.",
        "",
        *_table(systems),
    ]
    lines += ["", "## Targets (issue 23)", "", *targets(systems), "", "## Key by key", ""]
    for s in systems:
        for n, mismatches in enumerate(s["earlier_mismatches"]):
            shown = f"**{mismatches:,}**" if mismatches else "0"
            lines.append(f"- {s['system']}, round {n + 1} after the stream: mismatches {shown}")
        for moment, check, cost in (
            ("after the stream", s["check"], s["before"]),
            ("after maintenance", s["after_check"], s["after"]),
        ):
            spark_rows = f"{cost['spark_rows']:,}"
            if cost["spark_rows"] != check["expected"]:
                spark_rows = f"**{spark_rows}**"
            head = (
                f"- {s['system']}, round {len(s['rounds'])} {moment}: {check['rows']:,} rows through "
                f"PyIceberg, {spark_rows} counted by Spark SQL, model {check['expected']:,}; "
                f"mismatches {_mismatches(check)}"
            )
            lines.append(head)
            lines += [f"  - {example}" for example in check["examples"]]
    return "\n".join(lines) + "\n"
