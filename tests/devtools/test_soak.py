"""The soak mode's judgement (RSS flatness, lag bound, exact rows on real Iceberg tables), the pinned
process tree and the 1-to-2 core target, and the chunked records of the 10M-record runs. The soak
itself runs for 30 minutes by hand (docs/benchmarks/soak.md); these check what decides its verdicts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from bench import limit, report, side_by_side, soak
from bench.context import catalog_settings
from bench.proctree import run_child
from bench.report import (
    CONNECT,
    OURS_BATCH,
    OURS_CONTINUOUS,
    Measurement,
    summarise,
    targets,
)
from bench.workload import Variant, create_tables, parse_variant, value_chunks, values
from pyiceberg.table import Table

from fanout_sink.catalog import load_catalog

RATE = 1000.0


def _series(rss: list[float], lag: int = 500, step_s: float = 60.0) -> list[soak.Sample]:
    """RSS ``rss`` per sample: a flat 300 MB driver JVM, the rest in the Python workers."""
    return [
        soak.Sample(n * step_s, mb, mb / 3, lag, 1.5, {"driver JVM": 300.0, "Python workers": mb - 300})
        for n, mb in enumerate(rss)
    ]


def test_flat_rss_after_warm_up_is_met_and_the_warm_up_is_not_judged() -> None:
    # Minute 0-4 grow (warm-up), then 2,000 MB +- 5%: within 10% of the first post-warm-up sample.
    samples = _series([600, 1200, 1800, 1900, 1950, 2000, 2080, 1950, 2090, 2010, 1990])
    figures = soak.analyse(samples, warm_up_s=300, duration_s=600, rate=RATE, commit_interval_s=10)
    assert figures["rss_post_warm_up_mb"] == 2000 and figures["rss_max_mb"] == 2090
    assert figures["rss_max_deviation"] == pytest.approx(0.045)
    assert figures["rss_flat"] and figures["judged_samples"] == 6


def test_rss_growing_past_10_percent_is_missed_with_its_slope() -> None:
    samples = _series([2000 + 30 * n for n in range(11)])  # +30 MB a minute: 300 MB per 10 minutes
    figures = soak.analyse(samples, warm_up_s=0, duration_s=600, rate=RATE, commit_interval_s=10)
    assert figures["rss_max_deviation"] == pytest.approx(0.15)
    assert not figures["rss_flat"]
    assert figures["rss_slope_mb_per_10min"] == pytest.approx(300.0)
    assert figures["kind_growth_mb"] == {"driver JVM": 0.0, "Python workers": 300.0}  # where it grows


def test_samples_after_the_duration_are_the_drain_and_not_judged() -> None:
    samples = _series([2000, 2010, 2020, 700, 3500])  # the stopping JVM at minutes 3 and 4
    figures = soak.analyse(samples, warm_up_s=0, duration_s=120, rate=RATE, commit_interval_s=10)
    assert figures["rss_flat"] and figures["judged_samples"] == 3


def test_lag_is_bounded_by_three_commit_intervals_of_production() -> None:
    within = soak.analyse(_series([2000] * 5, lag=30_000), 0, 600, RATE, 10)
    assert within["lag_bounded"] and within["lag_max_s"] == 30.0 and within["lag_bound"] == 30_000
    behind = soak.analyse(_series([2000] * 5, lag=30_001), 0, 600, RATE, 10)
    assert not behind["lag_bounded"]


def test_too_few_samples_after_warm_up_name_the_fix() -> None:
    with pytest.raises(SystemExit, match="--duration longer than --warm-up"):
        soak.analyse(_series([2000, 2000]), warm_up_s=300, duration_s=600, rate=RATE, commit_interval_s=10)


def _append(table: Table, seqs: list[int], route: str) -> None:
    """One PyIceberg append (one data file) of rows numbered ``seqs`` carrying route ``route``."""
    given = {"id": [f"r-{n}" for n in seqs], "table": [route] * len(seqs), "seq": seqs}
    schema = table.schema().as_arrow()
    table.append(
        pa.table([pa.array(given.get(f.name, [None] * len(seqs)), f.type) for f in schema], schema=schema)
    )


def test_count_rows_finds_a_duplicate_a_loss_and_a_misrouted_row_in_real_tables(tmp_path: Path) -> None:
    catalog = load_catalog(catalog_settings(tmp_path))
    variant = Variant("uniform", 2)
    create_tables(catalog, variant)
    t0, t1 = (catalog.load_table(name) for name in variant.table_names())
    _append(t0, [0, 2, 4], "t0")
    _append(t1, [1, 3], "t1")
    exact = soak.count_rows(catalog, variant.table_names(), produced=5)
    assert exact == soak.ExactRows(5, 5, 0, 0, 0) and exact.exact
    _append(t1, [3, 5], "t1")  # 3 again (in another file), 5 was never produced
    _append(t0, [7], "t1")  # a t1 row in t0
    counted = soak.count_rows(catalog, variant.table_names(), produced=8)
    assert counted == soak.ExactRows(produced=8, rows=8, duplicates=1, missing=1, misrouted=1)
    assert not counted.exact  # seq 6 missing; 3 twice; 7 in the wrong table


def test_the_soak_targets_join_the_issue_table() -> None:
    figures = soak.analyse(_series([2000] * 6), 0, 600, RATE, 10)
    data = {
        **figures,
        "duration_s": 1800.0,
        "warm_up_s": 300.0,
        "rows": {"produced": 10, "duplicates": 0, "missing": 1},
        "exact": False,
    }
    rows = targets([], None, 2, data)
    assert (
        "| soak: RSS within 10% of its post-warm-up value (25 min after warm-up) | max deviation 0.0% | met |"
        in rows
    )
    assert "| soak: 0 duplicates, 0 losses | 0 duplicates, 1 missing of 10 | **missed** |" in rows
    assert "| soak: lag bounded | max 0.5 s of production | met |" in rows


def _measurement(system: str, cores: int, taskset: str | None, steady_s: float) -> Measurement:
    return Measurement(
        cores, "uniform-3", 0, system, 1_000_000, 244.0, steady_s + 10, 20.0, 1000.0, None, steady_s,
        [1], [1], taskset=taskset,
    )  # fmt: skip


def test_pinned_cpus_counts_a_taskset_list() -> None:
    assert [report.pinned_cpus(t) for t in ("0", "0-1", "0,2-3", "1")] == [1, 2, 3, 1]


def test_scaling_compares_the_pinned_runs_only_and_shows_connect_beside() -> None:
    measurements = [
        _measurement(OURS_CONTINUOUS, 1, "0", 20.0),  # 50,000 records/s
        _measurement(OURS_CONTINUOUS, 2, "0-1", 12.0),  # 83,333: 1.67x
        _measurement(OURS_CONTINUOUS, 2, None, 5.0),  # unpinned 2 cores: not the scaling figure
        _measurement(CONNECT, 1, "0", 50.0),
        _measurement(CONNECT, 2, "0-1", 30.0),
    ]
    summaries = summarise(measurements)
    assert len(summaries) == 5  # pinned and unpinned runs of the same cores are apart
    rows = targets(summaries, None, 2)
    assert "| 1 to 2 pinned cores >= 1.8x (continuous steady state, uniform-3, taskset) | 1.67x; " in rows[-2]
    assert rows[-2].endswith("| **missed** |") and "Connect 1.50x (wall)" in rows[-2]
    kept = report.merge_measurements(
        [m.__dict__ for m in measurements], [_measurement(OURS_CONTINUOUS, 2, None, 4.0)]
    )
    ours = [(m["cores"], m["taskset"] or "", m["steady_s"]) for m in kept if m["system"] == OURS_CONTINUOUS]
    assert sorted(ours) == [(1, "0", 20.0), (2, "", 4.0), (2, "0-1", 12.0)]


def test_a_pinned_child_and_its_children_run_on_the_given_cpu(tmp_path: Path) -> None:
    script = (
        "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    run = run_child([sys.executable, "-c", script], env={}, log=tmp_path / "log", cpus="0")
    assert run.returncode == 0 and run.stderr.split() == ["[0]", "[0]"]


def test_chunks_are_the_same_records_and_stay_on_their_partition() -> None:
    variant = Variant("mixed", 3)
    chunks = list(value_chunks(variant, 1001, chunk=100))
    assert [len(c) for c in chunks] == [100] * 10 + [1]
    assert [v for c in chunks for v in c] == values(variant, 1001)
    with pytest.raises(ValueError, match="must be even"):
        next(value_chunks(variant, 10, chunk=3))


def test_the_limit_splits_by_partition_and_reads_a_slice_at_a_time(tmp_path: Path) -> None:
    records = values(Variant("uniform", 3), 11)
    source = tmp_path / "v.jsonl"
    source.write_bytes(b"\n".join(records) + b"\n")
    parts = limit._split(source, tmp_path)
    slices = list(limit._raw_slices(parts[1], 1, 2))
    assert [s.column("value").to_pylist() for s in slices] == [records[1:5:2], records[5:9:2], [records[9]]]
    assert [s.column("offset").to_pylist() for s in slices] == [[0, 1], [2, 3], [4]]
    assert {p for s in slices for p in s.column("partition").to_pylist()} == {1}


def test_a_10m_run_sits_beside_the_1m_run_and_gets_its_own_rss_target() -> None:
    def run(system: str, records: int, rss: float) -> Measurement:
        return Measurement(
            2, "uniform-3", 0, system, records, records / 4000, 10.0, 20.0, rss, None, None, [1], [1]
        )

    small = [run(OURS_BATCH, 1_000_000, 1_000.0), run(CONNECT, 1_000_000, 1_300.0)]
    big = [run(OURS_BATCH, 10_000_000, 1_500.0), run(CONNECT, 10_000_000, 1_400.0)]
    kept = report.merge_measurements([m.__dict__ for m in small], big)
    assert sorted(m["records"] for m in kept) == [1_000_000, 1_000_000, 10_000_000, 10_000_000]
    rows = targets(summarise(Measurement(**m) for m in kept), None, 2)
    assert "| peak RSS <= Connect's, 3 tables | 1,000 vs 1,300 MB | met |" in rows
    assert "| peak RSS <= Connect's, 3 tables, 10,000,000 records | 1,500 vs 1,400 MB | **missed** |" in rows


def test_a_templated_record_is_the_generator_s_with_a_new_id_and_seq() -> None:
    variant = Variant("uniform", 3)
    generated = values(variant, 3)
    pool = soak.templates(variant, 3)
    assert soak.record(2, pool[2]) == generated[2]
    assert json.loads(soak.record(123_456, pool[1])) == {
        **json.loads(generated[1]),
        "id": "r-123456",
        "seq": 123_456,
    }


def test_soak_md_shows_the_verdicts_the_series_per_minute_and_the_output() -> None:
    samples = _series([2000, 2010, 2020, 2030], step_s=30.0)
    figures = soak.analyse(samples, 0, 120, RATE, 10)
    data = {
        **figures,
        "command": "PYTHONPATH=tests python -m bench.side_by_side --soak",
        "variant": "uniform-3",
        "rate": RATE,
        "achieved_rate": RATE,
        "load": None,
        "capacity": None,
        "duration_s": 120.0,
        "warm_up_s": 0.0,
        "commit_interval_s": 10.0,
        "taskset": None,
        "records": 120_000,
        "drained_s": 130.0,
        "cpu_s": 240.0,
        "rows": {"produced": 120_000, "rows": 120_000, "duplicates": 0, "missing": 0, "misrouted": 0},
        "exact": True,
        "samples": [s.__dict__ for s in samples],
        "output": ["soak: producing at 1,000 records/s"],
    }
    text = soak.markdown(data)
    assert "| 0 duplicates, 0 losses, every row in its table | 120,000 rows of 120,000: 0 duplicates" in text
    assert "max deviation 1.5%" in text and "| met |" in text
    assert "| 0 | 2,000 | 667 | 500 | 1.50 |" in text and "| 1 | 2,020 |" in text  # first sample per minute
    assert "    soak: producing at 1,000 records/s" in text
    assert "per process kind: Python workers +30, driver JVM +0." in text
    assert "| 1.50 | driver JVM 300, Python workers 1,700 |" in text
    assert "[soak.md](soak.md)" in report.markdown({"soak": data})


def test_command_keys_keep_runs_of_other_systems_variants_and_sizes_apart() -> None:
    def key(
        systems: str,
        variants: str,
        records: int = 1_000_000,
        taskset: str | None = None,
        partitions: int = 2,
        spark: tuple[tuple[str, str], ...] = (),
    ) -> str:
        return side_by_side.command_key(
            argparse.Namespace(
                cores=2,
                taskset=taskset,
                spark=list(spark),
                records=records,
                partitions=partitions,
                systems=systems.split(","),
                variants=[parse_variant(v) for v in variants.split(",")],
            )
        )

    runs = [
        key("available-now,continuous,connect", "uniform-3"),
        key("available-now", "uniform-3"),  # a rerun of one system must not hide the full run's command
        key("continuous", "uniform-50,mixed-50"),
        key("available-now,connect", "uniform-3", records=10_000_000),
        key("continuous,connect", "uniform-3", taskset="0-1"),
        key("continuous", "uniform-3", partitions=8),
        key("available-now", "uniform-3", spark=(("groups-per-task", "2"),)),  # an A/B of a setting
    ]
    assert len(set(runs)) == len(runs)
    assert key("available-now", "uniform-3") == runs[1], "the same run again replaces its own command"
    assert (
        runs[3]
        == "throughput, --cores 2 --records 10000000 --systems available-now,connect --variants uniform-3"
    )
