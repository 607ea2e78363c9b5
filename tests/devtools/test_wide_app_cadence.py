"""The wide app benchmark's cadence mode (issue 50's cadence target): the skewed feed, the sink YAML
it runs, and the figures read off the tables' snapshots; the run itself is the lead's (wide-sinks.md)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from bench import cadence, ours, wide_app
from bench.cadence import Commit, Skew, TableHistory
from bench.context import RunContext
from bench.workload import Variant
from support.raw_slices import make_raw_slice

from fanout_sink.config.loading import load_config
from fanout_sink.protocol.table_cadence import CommitIntervals
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.record_view import RecordView
from fanout_sink.transform.routing import Router


def test_the_first_5_percent_of_the_tables_get_90_percent_and_every_table_some_in_each_cycle() -> None:
    skew = Skew.of(5000, 0.05, 0.9)
    assert (skew.hot, skew.hot_each, skew.cycle) == (250, 171, 47_500)
    assert round(skew.hot_record_share, 3) == 0.9
    counts = Counter(skew.slots())
    assert len(counts) == 5000
    assert {counts[p] for p in range(250)} == {171} and {counts[p] for p in range(250, 5000)} == {1}
    # Interleaved, not in bursts: every tenth of a cycle carries hot and cold tables alike.
    tenth = skew.slots()[: skew.cycle // 10]
    assert 0.85 < sum(1 for p in tenth if p < 250) / len(tenth) < 0.95
    # Without a hot share the feed is the wide app's as ever: record n to partition n % tables.
    assert Skew.of(7, 0.0, 0.9).slots() == list(range(7))


def test_the_sink_yaml_routes_each_record_once_and_gives_only_the_cold_tables_the_interval(
    tmp_path: Path,
) -> None:
    skew = Skew.of(20, 0.1, 0.9)
    ctx = RunContext(
        bootstrap="127.0.0.1:9092",
        topic="wide",
        variant=Variant("uniform", 20),
        records=0,
        values_file=Path("/dev/null"),
        commit_interval_s=30.0,
        cores=2,
        max_offsets_per_trigger=None,
        folder=tmp_path,
    )
    command = ours.dynamic_command(ctx, "wide", "30s", skew.routes(), 300.0)
    config = load_config(command[command.index("--config") + 1])
    assert set(config.tables) == {"bench.t0", "bench.t1"}
    intervals = CommitIntervals.of(config)
    assert [intervals.interval_s(t) for t in ("bench.t0", "bench.t1", "bench.t2", "bench.t19")] == [
        None,
        None,
        300.0,
        300.0,
    ]
    # A hot table is named by its route and by dynamic.table (applies-to all): one row, not two.
    raw = make_raw_slice([json.dumps({"table": f"bench.t{p}", "seq": p}).encode() for p in (0, 1, 5)])
    view = RecordView.build(JsonDecoder()(raw.column("value").combine_chunks()), raw)
    routes = Router(config).route(view)
    assert {t: p.tolist() for t, p in routes.tables.items()} == {
        "bench.t0": [0],
        "bench.t1": [1],
        "bench.t5": [2],
    }
    # One cadence for all: the same routes, no dynamic interval.
    same = ours.dynamic_command(ctx, "wide", "30s", skew.routes(), None)
    assert (
        "commit-interval" not in yaml.safe_load(Path(same[same.index("--config") + 1]).read_text())["dynamic"]
    )


def _history(name: str, every_s: int, files: int, window: tuple[int, int], lag_s: int = 5) -> TableHistory:
    """A table committed every ``every_s`` seconds in ``window`` (epoch s), ``files`` added each time,
    its VTTS ``lag_s`` behind each commit; one commit id per commit time (the round)."""
    commits = [
        Commit(at * 1000, (at - lag_s) * 1000, files, f"round-{at}")
        for at in range(window[0], window[1] + 1, every_s)
    ]
    return TableHistory(name, commits, live_files=len(commits) * files, stored_files=len(commits) * files)


def test_snapshots_files_and_vtts_ages_over_the_judged_window_and_the_target_judged() -> None:
    """20 tables, 2 hot; one hour judged from 100 s after producing began at epoch 1,000,000 s."""
    skew = Skew.of(20, 0.1, 0.9)
    start, window = 1_000_000, (100.0, 3700.0)
    span = (start + 100, start + 3700)
    names = [f"bench.t{p}" for p in range(20)]
    every = [_history(n, 60, 2, span) for n in names]
    base = cadence.facts(every, skew, None, start, window)
    assert base.snapshots_per_hour == 20 * 61 and base.hot_snapshots_per_hour == 2 * 61
    assert base.files_per_table_hour == 2 * 61 and base.max_round_tables == 20
    # VTTS 5 s behind each commit, commits 60 s apart: ages 5-64 s, read every 5 s.
    assert base.hot_age.median_s is not None and 30 <= base.hot_age.median_s <= 35
    assert base.hot_age.max_s == 60.0

    hot = [_history(n, 60, 2, span) for n in names[:2]]
    cold = [_history(n, 600, 1, span) for n in names[2:]]
    with_cadence = cadence.facts(hot + cold, skew, 600.0, start, window)
    assert with_cadence.cold_snapshots_per_hour == 18 * 7 and with_cadence.hot_snapshots_per_hour == 2 * 61
    assert with_cadence.cold_age.max_s == 600.0 and with_cadence.hot_age == base.hot_age
    # Each cold commit lands in a round of the hot ones (one commit id per time): 61 rounds.
    assert len(with_cadence.rounds) == 61 and with_cadence.max_round_tables == 20
    assert min(r.hot for r in with_cadence.rounds) == 2

    text = cadence.compare({"cadence": _json(base)}, {"cadence": _json(with_cadence)})
    # 1,220 / (122 + 126) snapshots: 4.92x, just short; files 2,440 / (244 + 126) per 20 tables: 6.59x.
    assert "| snapshots per hour | 1,220 | 248 | 4.92x: **NOT met** |" in text
    assert "6.59x: met" in text and "unchanged: met" in text
    lines = cadence.report(with_cadence, 60.0, [])
    assert any(line.startswith("| VTTS age s, hot tables: median, max |") for line in lines)


def _json(facts: cadence.CadenceFacts) -> dict[str, object]:
    data: dict[str, object] = json.loads(json.dumps(asdict(facts)))
    return data


def test_a_tables_vtts_at_a_time_is_its_newest_commits_with_one_at_or_before_it() -> None:
    table = TableHistory(
        "t", [Commit(1000, 900, 1, "a"), Commit(2000, None, 1, "b"), Commit(3000, 2500, 1, "c")], 3, 3
    )
    assert table.vtts_over([999, 1000, 2500, 3000]) == [None, 900, 900, 2500]


def test_the_coordinators_round_lines_give_each_rounds_outcomes_and_waiting_tables() -> None:
    """What tells a round cut at its commit timeout (failed tables) from the app's log."""
    log = "\n".join(
        [
            "2026-12-07 18:00:01,123 INFO fanout_sink.protocol.coordinator: commit c-1 (interval): "
            "12 table(s) 10 committed, 2 failed, 40 files (bench.t1 failed (2 files), 11 more); "
            "5 table(s) waiting for their commit-interval; vtts 2026-12-07T18:00:00.000Z",
            "2026-12-07 18:00:02,000 INFO fanout_sink.app: batch 7: 10 records in 1 slices",
            "2026-12-07 18:00:31,123 INFO fanout_sink.protocol.coordinator: commit c-2 (batch-complete): "
            "3 table(s) waiting for their commit-interval; no vtts",
            "2026-12-07 18:01:01,123 INFO fanout_sink.protocol.coordinator: commit c-3 (stop): 2 table(s) "
            "1 already-committed, 1 committed, 2 files (bench.t1 committed (1 files)); "
            "vtts 2026-12-07T18:00:00.000Z",
        ]
    )
    lines = cadence.round_lines(log)
    assert [(r.reason, r.outcomes, r.waiting, r.failed) for r in lines] == [
        ("interval", {"committed": 10, "failed": 2}, 5, 2),
        ("batch-complete", {}, 3, 0),
        ("stop", {"already-committed": 1, "committed": 1}, 0, 0),
    ]
    assert round(lines[1].at - lines[0].at, 3) == 30.0


def test_a_comparison_with_a_run_not_in_the_out_file_stops_before_anything_runs(tmp_path: Path) -> None:
    """A 5,000-table run takes half an hour: a mistyped --compare-with label must not wait for its end."""
    out = tmp_path / "wide-app.json"
    out.write_text(json.dumps({"5000-skew": {}}))
    argv = ["--tables", "5000", "--cold-commit-interval", "600", "--label", "5000-cadence"]
    with pytest.raises(SystemExit, match="--compare-with 5000-skw: no such run in --out"):
        wide_app.main(
            [*argv, "--compare-with", "5000-skw", "--out", str(out), "--bootstrap-servers", "nowhere:1"]
        )
