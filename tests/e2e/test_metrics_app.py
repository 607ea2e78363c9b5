"""The driver's Prometheus endpoint, scraped while the real app runs: what it says matches the tables,
and Spark's own metrics system (here its CSV sink) reports the same values and the query's."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from chaos.app_process import child_env
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families
from support.sink_factory import SinkFactory

from fanout_sink.devtools.stack.broker import free_port

pytestmark = pytest.mark.usefixtures("own_spark")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics``, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def spark_csv(folder: Path) -> dict[str, float]:
    """The latest value of every metric Spark's CSV sink wrote, by name without the ``<app>.driver.``
    prefix (the sink's own under ``fanout_sink.``, which is dropped too)."""
    latest = {}
    for path in folder.glob("*.driver.*.csv"):
        lines = path.read_text().splitlines()
        if len(lines) < 2:
            continue
        name = path.name.removesuffix(".csv").split(".driver.", 1)[1].removeprefix("fanout_sink.")
        latest[name] = float(lines[-1].split(",")[1])
    return latest


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (found, labels), value in samples.items() if found == name}


def test_metrics_scraped_during_a_run_match_the_tables(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str], sink_factory: SinkFactory
) -> None:
    dlq = make_topic("dlq")
    port = free_port()
    sink_run = sink_factory(
        commit_interval="1s",
        overrides={"metrics": {"port": port}, "dead-letter": {"topic": dlq}},
    )
    sink_run.produce(600)
    bad = Producer({"bootstrap.servers": bootstrap_servers})
    for n in range(3):
        bad.produce(sink_run.topics["clicks"], key=f"bad-{n}".encode(), value=b"{not json")
    bad.flush(30)

    csv = tmp_path / "spark-metrics"
    csv.mkdir()
    spark_sink = "spark.metrics.conf.driver.sink.csv"
    csv_sink = {"class": "org.apache.spark.metrics.sink.CsvSink", "period": "1", "unit": "seconds"}
    conf = [f"--conf={spark_sink}.{key}={value}" for key, value in {**csv_sink, "directory": csv}.items()]
    app = subprocess.Popen(
        sink_run.command("--trigger-interval", "1s", *conf),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "app.log").open("w"),
        env=child_env(),
        start_new_session=True,
    )
    try:
        samples: Samples = {}
        rows: dict[str, float] = {}
        lag: dict[tuple[tuple[str, str], ...], float] = {}
        deadline = time.monotonic() + 300
        expected_rows = sum(len(ids) for ids in sink_run.expected.values())
        while time.monotonic() < deadline and app.poll() is None:
            try:
                samples = scrape(port)
            except OSError:  # not serving yet
                time.sleep(0.5)
                continue
            rows = by_label(samples, "fanout_sink_rows_committed_total", "table")
            lag = {labels: v for (name, labels), v in samples.items() if name == "fanout_sink_partition_lag"}
            if sum(rows.values()) == expected_rows and len(lag) == 5 and not any(lag.values()):
                break
            time.sleep(0.5)
        else:
            pytest.fail(
                f"metrics never caught up: rows {rows}, lag {lag}\n{(tmp_path / 'app.log').read_text()}"
            )

        ids = sink_run.table_ids()
        assert rows == {table: len(ids[table]) for table in sink_run.expected}, (
            "rows committed = rows in table"
        )
        files = by_label(samples, "fanout_sink_files_committed_total", "table")
        assert set(files) == set(rows) and all(count >= 1 for count in files.values())
        assert by_label(samples, "fanout_sink_dead_letters_total", "topic") == {
            sink_run.topics["clicks"]: 3.0,
            sink_run.topics["orders"]: 0.0,
        }
        records = by_label(samples, "fanout_sink_records_read_total", "topic")
        assert sum(records.values()) == 603
        now = time.time()
        vtts = by_label(samples, "fanout_sink_table_vtts_timestamp_seconds", "table")
        assert set(vtts) == set(rows) and all(0 < value <= now for value in vtts.values())
        ages = by_label(samples, "fanout_sink_table_vtts_age_seconds", "table")
        assert all(age >= 0 for age in ages.values()) and set(ages) == set(rows)
        commits = by_label(samples, "fanout_sink_table_last_commit_timestamp_seconds", "table")
        assert all(now - 300 < value <= now for value in commits.values())
        assert by_label(samples, "fanout_sink_commit_failures_total", "table") == {}
        batches = by_label(samples, "fanout_sink_batch_duration_seconds_count", "sink")
        assert batches[sink_run.name] >= 1
        info = by_label(samples, "fanout_sink_info", "sink")
        assert info == {sink_run.name: 1.0}

        # The same values in Spark's metrics system, as its sinks see them (one CSV file per metric).
        wanted = {f"rows_committed_total.{table}": count for table, count in rows.items()}
        wanted[f"dead_letters_total.{sink_run.topics['clicks']}"] = 3.0
        seen: dict[str, float] = {}
        while time.monotonic() < deadline and seen != wanted:
            seen = {name: value for name, value in spark_csv(csv).items() if name in wanted}
            time.sleep(0.5)
        assert seen == wanted
        assert any(name.startswith(f"spark.streaming.{sink_run.name}.") for name in spark_csv(csv)), (
            "spark.sql.streaming.metricsEnabled: the query's own metrics"
        )
    finally:
        app.send_signal(signal.SIGTERM)
        assert app.wait(120) == 0, (tmp_path / "app.log").read_text()[-4000:]
    sink_run.assert_exact()
