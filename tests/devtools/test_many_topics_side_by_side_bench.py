"""The 300-table side-by-side benchmark: both systems get the same topics, routing and auto-create,
fanout_sink's shares of Connect's wall, CPU and RSS are judged against issue 50's targets, and a small
run of both lands every row exactly."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from bench import connect_peer
from bench import many_topics_side_by_side as side
from bench.context import catalog_settings

PREFIX = "mtabc123"


def test_both_systems_match_the_same_topics_route_by_tbl_and_auto_create(tmp_path: Path) -> None:
    settings = catalog_settings(tmp_path)
    ours = side.ours_config("ours-x", PREFIX, "broker:9092", settings, tmp_path, 2, 10.0)
    connect = side.connector_config("connect-x", PREFIX, "broker:9092", settings, 2, 10.0)
    assert ours["source"]["pattern"] == connect["topics.regex"]
    for topic, matched in ((f"{PREFIX}.t0", True), (f"{PREFIX}.t299", True), ("mtabc1234.t0", False)):
        assert bool(re.fullmatch(connect["topics.regex"], topic)) is matched
    # The record's tbl holds the whole table name; both take it as is and create the table.
    assert ours["dynamic"]["table"] == connect["iceberg.tables.route-field"] == "tbl"
    assert ours["dynamic"]["auto-create"] is True and connect["iceberg.tables.auto-create-enabled"] == "true"
    assert connect["iceberg.tables.dynamic-enabled"] == "true"
    assert re.fullmatch(ours["dynamic"]["allow"], "db.t7")
    # Two cores each, one commit interval, one catalog file per run.
    assert ours["spark"]["master"] == "local[2]" and connect["tasks.max"] == "2"
    assert (
        ours["control"]["commit-interval"] == "10s"
        and connect["iceberg.control.commit.interval-ms"] == "10000"
    )
    assert connect["iceberg.catalog.uri"] == f"jdbc:sqlite:{tmp_path / 'catalog.db'}"
    assert connect["iceberg.catalog"] == ours["catalog"]["name"]
    assert connect["connector.class"] == "org.apache.iceberg.connect.IcebergSinkConnector"


def test_the_shares_are_ours_over_connects_and_judged_against_issue_50s_targets() -> None:
    """The issue's last figures: 20.1 s against 50.6 s misses the 0.3x wall target; CPU 0.47x and
    memory 0.55x meet theirs."""
    ours = {"wall_s": 20.1, "cpu_s": 14.1, "peak_rss_mb": 1_100}
    connect = {"wall_s": 50.6, "cpu_s": 30.0, "peak_rss_mb": 2_000}
    shares = side.ratios(ours, connect)
    assert shares == {"wall": 0.397, "cpu": 0.47, "rss": 0.55}
    assert side.verdicts(shares) == {"wall": False, "cpu": True, "rss": True}
    assert side.verdicts({"wall": 0.3, "cpu": 0.5, "rss": 0.6}) == {"wall": True, "cpu": True, "rss": True}
    assert side.verdicts({"wall": 0.29, "cpu": 0.51, "rss": 0.61}) == {
        "wall": True,
        "cpu": False,
        "rss": False,
    }


def test_the_sinks_wall_is_split_by_its_log() -> None:
    started = datetime(2026, 12, 7, 19, 0, 0).timestamp()
    log = (
        "2026-12-07 19:00:03,500 INFO fanout_sink.spark.session: Spark session ready in 2.1s (class "
        "archive spark-driver-0123456789abcdef.jsa mapped)\n"
        "2026-12-07 19:00:12,000 INFO fanout_sink.app: batch 0: 60000 records in, 0 already delivered, 0 "
        "dead-lettered, 0 filtered, rows {}, files {} (8.0s, 300 slices, peak worker RSS 300 MB), "
        "7500 records/s\n"
        "2026-12-07 19:00:15,500 INFO fanout_sink.app: final commit round c1: 300 table(s), 2 told, "
        "300 file(s)\n"
    )
    assert side.phases(log, started) == {
        "to_session_s": 3.5,
        "to_first_batch_s": 4.0,
        "batches_s": 8.0,
        "to_final_commit_s": 15.5,
    }
    assert side.phases("nothing yet\n", started) == {}
    # Whether the driver JVM mapped its class archive: a run without it is seconds slower to start.
    assert side.class_archive(log) == "mapped"
    refused = log.replace("spark-driver-0123456789abcdef.jsa mapped", "refused")
    assert side.class_archive(refused) == "refused"
    assert (
        side.class_archive(
            log.replace("class archive spark-driver-0123456789abcdef.jsa mapped", "no class archive")
        )
        == "none"
    )
    assert side.class_archive("nothing yet\n") is None


def test_a_run_renders_each_system_and_the_verdicts_below_the_marker(tmp_path: Path) -> None:
    def figures(system: str, wall: float, cpu: float, rss: float) -> dict[str, object]:
        return {
            "system": system, "wall_s": wall, "first_visible_s": 5.0, "records_per_s": 3000, "cpu_s": cpu,
            "peak_rss_mb": rss, "role_cpu_s": {"driver JVM": 3.0}, "role_rss_mb": {}, "tables_exact": 300,
            "problems": [], "load_start": [1.0, 1, 1], "load_end": [2.0, 1, 1],
            "phases": {"to_first_batch_s": 4.0} if system == side.OURS else {},
            "class_archive": "mapped" if system == side.OURS else None,
        }  # fmt: skip

    ours, connect = figures(side.OURS, 14.0, 14.0, 1000), figures(connect_peer.SYSTEM, 50.0, 30.0, 2000)
    run = {
        "command": "PYTHONPATH=tests python -m bench.many_topics_side_by_side", "commit": "abc1234",
        "topics": 300, "events": 60000, "produce_s": 3.0, "commit_interval_s": 10.0, "cores": 2,
        "systems": [ours, connect], "ratios": side.ratios(ours, connect),
    }  # fmt: skip
    page = tmp_path / "page.md"
    page.write_text("# Side by side\n\nWritten by hand.\n")
    side.write_markdown(page, {"run 1": run})
    text = page.read_text()
    assert text.startswith("# Side by side\n\nWritten by hand.\n") and side.MARKER in text
    assert "| fanout_sink | 14.0 |" in text and "| 300/300 |" in text
    assert "| wall at most 0.3x | 0.28x | met |" in text
    assert (
        "| CPU s at most 0.5x | 0.47x | met |" in text and "| peak RSS at most 0.6x | 0.50x | met |" in text
    )
    assert "to first batch 4.0 s; class archive mapped;" in text


@pytest.mark.bench
def test_both_systems_land_every_row_of_a_few_topics(
    bootstrap_servers: str, own_spark: None, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = [
        *("--topics", "4", "--events", "80", "--commit-interval", "2", "--timeout", "400"),
        *("--bootstrap-servers", bootstrap_servers, "--out", str(out), "--work-dir", str(tmp_path / "work")),
    ]
    assert side.main(argv) == 0
    (run,) = json.loads((out / side.JSON_NAME).read_text()).values()
    assert [s["system"] for s in run["systems"]] == [side.OURS, connect_peer.SYSTEM]
    for system in run["systems"]:
        assert system["tables_exact"] == 4 and not system["problems"]
        assert system["wall_s"] > 0 and system["cpu_s"] > 0 and system["peak_rss_mb"] > 0
    assert set(run["ratios"]) == {"wall", "cpu", "rss"}
    assert run["systems"][0]["phases"]["to_first_batch_s"] > 0
    assert run["systems"][0]["class_archive"] in {"mapped", "dumping"}
    assert "| wall at most 0.3x |" in (out / "many-topics-side-by-side.md").read_text()
