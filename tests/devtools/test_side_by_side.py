"""The side-by-side benchmark on tiny input: every system runs, lands the same rows, and the report
is written; a row missing from one system's real table is reported as a mismatch naming it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from bench import connect_peer, proctree, side_by_side
from bench.context import catalog_settings
from bench.landed import LandedRowsMismatchError, TableLanding, check_same_rows, commit_gaps, landed
from bench.report import (
    CONNECT,
    LIMIT,
    OURS_BATCH,
    OURS_CONTINUOUS,
    Measurement,
    Summary,
    markdown,
    targets,
    targets_at_scale,
    targets_sustained,
)
from bench.workload import Variant

from fanout_sink import jars
from fanout_sink.catalog import load_catalog
from fanout_sink.errors import StackError

RECORDS = 1000
VARIANT = Variant("mixed", 3)


@dataclass(frozen=True)
class SmokeRun:
    out: Path
    work: Path
    systems: list[str]
    connect_skipped: str


@pytest.fixture(scope="module")
def smoke(bootstrap_servers: str, own_spark: None, tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """One round of every system on 1000 mixed-type records (the harder variant), run folders kept.

    A run's time here is its start-up, so more records would prove nothing more. Each system's tree
    is sampled every second instead of every 0.2 s: a sample reads every process's ``/proc`` stat and
    the tree's ``smaps_rollup`` (38 ms of CPU each on the loaded 2-core machine, 12 CPU s per system
    run, beside the run's own 25), and the smoke judges no figure finer than "measured"."""
    systems, connect_skipped = list(side_by_side.SYSTEMS), ""
    try:
        for jar_set in (connect_peer.CONNECT_WORKER, connect_peer.ICEBERG_CONNECT_PLUGIN):
            jars.fetch(jar_set)
    except StackError as exc:  # only when mvn itself fails: the peer cannot be assembled here
        systems.remove("connect")
        connect_skipped = str(exc)
    root = tmp_path_factory.mktemp("side-by-side")
    out, work = root / "out", root / "work"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(proctree, "_SAMPLE_S", 1.0)
        code = side_by_side.main(
            ["--records", str(RECORDS), "--rounds", "1", "--variants", VARIANT.name,
             "--systems", ",".join(systems), "--commit-interval", "1",
             "--bootstrap-servers", bootstrap_servers, "--out", str(out), "--work-dir", str(work), "--keep"]
        )  # fmt: skip
    assert code == 0
    return SmokeRun(out, work, systems, connect_skipped)


@pytest.mark.bench
def test_every_system_ran_and_the_report_is_written(smoke: SmokeRun) -> None:
    data = json.loads((smoke.out / "results.json").read_text())
    measured = {m["system"] for m in data["measurements"]}
    assert len(measured) == len(smoke.systems)
    assert all(m["records"] == RECORDS and m["wall_s"] > 0 and m["cpu_s"] > 0 for m in data["measurements"])
    ours = [m for m in data["measurements"] if m["system"].startswith("fanout_sink")]
    assert ours and all(m["steady_s"] and m["worker_rss_mb"] for m in ours)  # batch lines and workers seen
    assert all(m["role_cpu_s"]["Python workers"] > 0 for m in ours)  # the CPU split by process kind
    text = (smoke.out / "throughput.md").read_text()
    for system in measured:
        assert f"| {VARIANT.name} | {system} |" in text
    assert "## Targets (issue 26)" in text and "cores" in data["machine"]
    assert (smoke.out / "throughput.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.bench
def test_connect_peer_ran(smoke: SmokeRun) -> None:
    if smoke.connect_skipped:
        pytest.skip(f"mvn could not fetch the Connect jars: {smoke.connect_skipped}")
    data = json.loads((smoke.out / "results.json").read_text())
    assert connect_peer.SYSTEM in {m["system"] for m in data["measurements"]}


@pytest.mark.bench
def test_a_dropped_row_is_reported_naming_system_and_table(smoke: SmokeRun) -> None:
    """The checker on a real landed table: one row deleted from the limit's table t1 after its run."""
    folder = smoke.work / VARIANT.name / "r0-limit"
    catalog = load_catalog(catalog_settings(folder))
    tables = VARIANT.table_names()
    before = landed(catalog, tables)
    victim = before["bench.t1"].ids[0].as_py()
    catalog.load_table("bench.t1").delete(f"id == '{victim}'")
    expected = side_by_side.expected_landing(smoke.work / f"{VARIANT.name}.jsonl", VARIANT)
    check_same_rows(("generated", expected), ("limit before", before))
    with pytest.raises(
        LandedRowsMismatchError, match=r"limit after landed different rows .* in bench\.t1"
    ) as err:
        check_same_rows(("generated", expected), ("limit after", landed(catalog, tables)))
    assert "1 of generated's ids missing" in str(err.value)


def test_the_targets_are_issue_26s_and_judged_from_the_figures() -> None:
    """The issue's own figures (67,600 vs 26,600 records/s, 19.7 vs 30.8 CPU s, 3,470 vs 1,360 MB)
    miss the 3x, 0.5x and RSS targets; a latency of interval + 2.5 s meets interval + 3 s."""

    def summary(
        variant: str, system: str, rate: float, cpu: float, rss: float, steady: float | None
    ) -> Summary:
        return Summary(
            2, variant, system, 2, (rate, rate, rate), (1.0, 1.0, 1.0), steady, cpu, rss, None, (1, 1), (1, 1)
        )

    rows = targets(
        [
            summary("uniform-3", OURS_BATCH, 67_600, 19.7, 3_470, None),
            summary("uniform-3", CONNECT, 26_600, 30.8, 1_360, None),
            summary("uniform-3", OURS_CONTINUOUS, 100_000, 20, 3_000, 180_000),
            summary("uniform-3", LIMIT, 387_600, 4.8, 1_470, None),
            summary("uniform-50", OURS_CONTINUOUS, 34_100, 20, 3_000, 34_100),
            summary("mixed-50", OURS_CONTINUOUS, 22_500, 20, 3_000, 22_500),
        ],
        {"commit_interval_s": 10.0, "p99_s": 12.5},
        2,
    )
    verdicts = {row.split(" | ")[0].lstrip("| "): row.rsplit(" | ", 1)[1].rstrip(" |") for row in rows[2:]}
    assert verdicts["wall records/s >= 3x Connect (uniform-3)"] == "**missed**"  # 2.54x
    assert verdicts["CPU s per 1M <= 0.5x Connect (uniform-3)"] == "**missed**"  # 0.64x
    assert verdicts["peak RSS <= Connect's, 3 tables"] == "**missed**"
    assert verdicts["continuous steady state >= 45% of the 2-process limit (uniform-3)"] == "met"  # 46%
    assert verdicts["mixed-type steady state >= 80% of uniform (50 tables)"] == "**missed**"  # 66%
    assert verdicts["produce-to-visible p99 <= commit interval + 3 s (13 s)"] == "met"


def _summary(
    variant: str, system: str, rate: float, cpu: float, rss: float, steady: float | None, records: int
) -> Summary:
    return Summary(
        2, variant, system, 1, (rate, rate, rate), (1.0, 1.0, 1.0), steady, cpu, rss, None, (1, 1), (1, 1),
        records=records,
    )  # fmt: skip


def test_the_targets_at_scale_are_issue_34s_judged_at_10m_records() -> None:
    """Issue 34's own 10M figures (143,106 vs 138,301 records/s, 6.5 vs 8.8 CPU s per 1M, 1,677 vs
    1,375 MB) miss the 1.5x, 0.5x and RSS targets; the 1M figures are judged apart from them."""
    ten = 10_000_000
    rows = targets_at_scale(
        [
            _summary("uniform-3", OURS_BATCH, 143_106, 6.5, 1_677, 206_612, ten),
            _summary("uniform-3", CONNECT, 138_301, 8.8, 1_375, None, ten),
            _summary("uniform-3", OURS_BATCH, 67_600, 15, 700, 100_000, 1_000_000),
            _summary("uniform-3", CONNECT, 26_600, 22, 769, None, 1_000_000),
            _summary("uniform-3", LIMIT, 250_000, 5, 1_500, None, ten),
            _summary("uniform-50", OURS_BATCH, 100_000, 8, 1_600, 150_000, ten),
            _summary("mixed-50", OURS_BATCH, 90_000, 9, 1_600, 120_000, ten),
        ],
        2,
    )
    verdicts = {row.split(" | ")[0].lstrip("| "): row.rsplit(" | ", 1)[1].rstrip(" |") for row in rows[2:]}
    assert verdicts["10M uniform-3: wall records/s >= 1.5x Connect's"] == "**missed**"  # 1.03x
    assert verdicts["10M uniform-3: CPU s per 1M <= 0.5x Connect's"] == "**missed**"  # 0.74x
    assert verdicts["1,000,000 uniform-3: peak RSS of the tree <= Connect's"] == "met"  # 700 vs 769
    assert verdicts["10,000,000 uniform-3: peak RSS of the tree <= Connect's"] == "**missed**"
    assert verdicts["10M uniform-3: steady state >= 80% of the 2-process in-process limit"] == "met"  # 83%
    assert verdicts["10M, 50 tables: mixed-type steady state >= 85% of uniform"] == "**missed**"  # 80%


def test_the_cpu_of_each_process_kind_is_split_into_fixed_and_per_record_across_sizes() -> None:
    """Two sizes on one line: 10 s fixed + 5 s per 1M in the workers, 4 s fixed + 0.5 s per 1M in the JVM."""

    def run(records: int, workers: float, jvm: float) -> dict[str, object]:
        measured = Measurement(
            2, "uniform-3", 0, OURS_BATCH, records, 1.0, 10.0, workers + jvm, 1_000.0, None, 5.0, [1], [1],
            role_cpu_s={"Python workers": workers, "driver JVM": jvm},
        )  # fmt: skip
        return asdict(measured)

    text = markdown({"measurements": [run(1_000_000, 15.0, 4.5), run(11_000_000, 65.0, 9.5)]})
    assert "| 2 | uniform-3 | fanout_sink available-now | 11,000,000 | 74.5 | 9.5 | 65.0 |" in text
    assert "| 1,000,000, 11,000,000 | 14.0 + 5.50/1M | 4.0 + 0.50/1M | 10.0 + 5.00/1M |" in text


def test_the_sustained_targets_pair_each_run_with_connects_run_of_the_same_round() -> None:
    """Issue 48 asks for both runs: round 0 at 1.4x and round 1 at 1.2x is a miss, and a table that
    committed once (no gap to judge) misses the freshness target while an old run without commit
    times is not judged."""

    def run(system: str, round_no: int, wall_s: float, gap: float | None, first: float | None) -> Measurement:
        return Measurement(
            2, "uniform-3", round_no, system, 10_000_000, 1.0, wall_s, wall_s, 1_000.0, None, None, [1], [1],
            first_commit_s=first, max_commit_gap_s=gap,
        )  # fmt: skip

    rows = targets_sustained(
        [
            run(OURS_BATCH, 0, 100.0, 12.0, 15.0),
            run(CONNECT, 0, 140.0, 10.0, 25.0),
            run(OURS_BATCH, 1, 100.0, None, 60.0),
            run(CONNECT, 1, 120.0, 10.0, 25.0),
        ],
        10.0,
    )
    verdicts = {row.split(" | ")[0].lstrip("| "): row.split(" | ")[1:] for row in rows[2:]}
    assert verdicts["10M uniform-3: wall records/s >= 1.3x Connect's"] == ["1.40x; 1.20x", "**missed** |"]
    fresh = verdicts["10M uniform-3: every table committed at least every 2 commit intervals (20 s)"]
    assert fresh == ["longest gap 12.0 s; one commit only", "**missed** |"]
    assert verdicts["50M uniform-3: wall records/s >= 1.3x Connect's"][1] == "not measured |"


def test_commit_gaps_are_the_first_commit_after_start_and_the_longest_wait_of_any_table() -> None:
    ids = pa.array([], pa.large_string())
    tables = {
        "a": TableLanding(ids, 1, 3, (11_000, 21_000, 26_000)),
        "b": TableLanding(ids, 1, 2, (12_000, 30_000)),
        "c": TableLanding(ids, 0, 0, ()),
    }
    assert commit_gaps(tables, 1_000) == (10.0, 18.0)
    assert commit_gaps({"c": tables["c"]}, 1_000) == (None, None)
