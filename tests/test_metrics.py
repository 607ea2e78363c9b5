"""The sink's Prometheus metrics from commit rounds and batches, without Spark or Kafka."""

from __future__ import annotations

import math
import socket
from dataclasses import replace

import pytest

from fanout_sink.config.runtime import MetricsSettings
from fanout_sink.errors import PreflightError
from fanout_sink.kafka.offsets import PartitionPosition
from fanout_sink.metrics import SinkMetrics
from fanout_sink.protocol.coordinator import RoundResult
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.table_cadence import CommitIntervals
from fanout_sink.protocol.table_commit import TableCommit


def value(metrics: SinkMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"sink": "s", **labels})


def round_of(vtts_ms: int | None, *outcomes: TableCommit) -> RoundResult:
    return RoundResult("c", 10, 10, vtts_ms, {outcome.identifier: outcome for outcome in outcomes})


def test_a_failing_table_keeps_its_vtts_while_the_others_follow_the_sink() -> None:
    metrics = SinkMetrics("s", 30.0)
    assert math.isnan(value(metrics, "fanout_sink_vtts_age_seconds") or 0.0), "no VTTS known yet"
    metrics.round_done(
        round_of(None, TableCommit("a.x", "committed", files=2, rows=7)),
        [PartitionPosition("t", 0, 3, 5)],
    )
    assert value(metrics, "fanout_sink_rows_committed_total", table="a.x") == 7
    assert value(metrics, "fanout_sink_partition_lag", topic="t", partition="0") == 2
    assert value(metrics, "fanout_sink_commit_interval_seconds") == 30
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.x") is None

    metrics.round_done(
        round_of(
            1_000_000,
            TableCommit("a.y", "committed", files=1, rows=3),
            TableCommit("a.z", "committed", files=1, rows=1),
        ),
        [PartitionPosition("t", 0, 5, 5)],
    )
    metrics.round_done(round_of(2_000_000, TableCommit("a.z", "failed", error="boom")), [])
    metrics.round_done(round_of(2_000_000, TableCommit("a.gone", "table-missing")), [])
    assert value(metrics, "fanout_sink_commit_failures_total", table="a.gone") == 1, "files not appended"
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.x") == 2000, "nothing due"
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.y") == 2000
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.z") == 1000, "it failed"
    assert value(metrics, "fanout_sink_commit_failures_total", table="a.z") == 1
    assert value(metrics, "fanout_sink_rows_committed_total", table="a.z") == 1
    assert value(metrics, "fanout_sink_partition_lag", topic="t", partition="0") == 0
    assert value(metrics, "fanout_sink_vtts_timestamp_seconds") == 2000
    age = value(metrics, "fanout_sink_table_vtts_age_seconds", table="a.z")
    assert age is not None and age > value(metrics, "fanout_sink_vtts_age_seconds")  # type: ignore[operator]

    metrics.round_failed(TimeoutError("broker down"))
    assert value(metrics, "fanout_sink_commit_round_failures_total") == 1
    assert value(metrics, "fanout_sink_commit_rounds_total", trigger="call") == 4, "counted by trigger"
    metrics.round_done(replace(round_of(None), reason="batch-complete"), [])
    assert value(metrics, "fanout_sink_commit_rounds_total", trigger="batch-complete") == 1


def test_a_table_waiting_for_its_commit_interval_keeps_its_vtts_and_shows_its_cadence() -> None:
    """Per-table cadence (issue 50 item 2): a waiting table's VTTS stays at its last commit's while the
    others follow the sink's; each table's commit interval is served (the sink's for the others), so
    the alert on a table's VTTS age scales with it."""
    metrics = SinkMetrics("s", 30.0, CommitIntervals(declared={"a.cold": 600.0, "a.hot": None}))
    both = (TableCommit("a.hot", "committed", files=1, rows=1), TableCommit("a.cold", "committed", files=1))
    metrics.round_done(round_of(1_000_000, *both), [])
    waiting = replace(round_of(2_000_000, TableCommit("a.hot", "committed", files=1)), waiting={"a.cold"})
    metrics.round_done(waiting, [])
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.hot") == 2000
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.cold") == 1000, "waiting"
    assert value(metrics, "fanout_sink_commit_failures_total", table="a.cold") is None, "not failing"
    assert value(metrics, "fanout_sink_table_commit_interval_seconds", table="a.cold") == 600
    assert value(metrics, "fanout_sink_table_commit_interval_seconds", table="a.hot") == 30
    metrics.round_done(round_of(3_000_000), [])  # nothing pending anywhere: every table holds it all
    assert value(metrics, "fanout_sink_table_vtts_timestamp_seconds", table="a.cold") == 3000


def test_a_change_table_counts_inserted_updated_and_deleted_rows() -> None:
    metrics = SinkMetrics("s", 30.0)
    change = TableCommit(
        "c.k", "committed", files=2, rows=9, inserted=4, updated=5, deleted=2, delete_files=1
    )
    metrics.round_done(round_of(None, change, TableCommit("a.x", "committed", files=1, rows=3)), [])
    metrics.round_done(round_of(None, TableCommit("c.k", "committed", files=1, rows=1, updated=1)), [])
    assert value(metrics, "fanout_sink_rows_changed_total", table="c.k", change="inserted") == 4
    assert value(metrics, "fanout_sink_rows_changed_total", table="c.k", change="updated") == 6
    assert value(metrics, "fanout_sink_rows_changed_total", table="c.k", change="deleted") == 2
    assert value(metrics, "fanout_sink_delete_files_committed_total", table="c.k") == 1
    assert value(metrics, "fanout_sink_rows_changed_total", table="a.x", change="inserted") is None, (
        "an append"
    )


def test_batches_count_records_and_dead_letters_per_source_topic() -> None:
    metrics = SinkMetrics("s", 30.0)
    metrics.batch_done(
        1.5,
        [
            SliceResult(Slice("t", 0, 0, 10), None, records_in=10, dead_lettered=2),
            SliceResult(Slice("t", 1, 0, 5), None, records_in=5),
            SliceResult(Slice("u", 0, 0, 4), None, records_in=4, dead_lettered=1),
        ],
    )
    assert value(metrics, "fanout_sink_dead_letters_total", topic="t") == 2
    assert value(metrics, "fanout_sink_dead_letters_total", topic="u") == 1
    assert value(metrics, "fanout_sink_records_read_total", topic="t") == 15
    assert value(metrics, "fanout_sink_batch_duration_seconds_count") == 1
    assert value(metrics, "fanout_sink_batch_duration_seconds_bucket", le="2.5") == 1


def test_a_taken_port_stops_the_start_naming_the_key() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(
            PreflightError, match=r"metrics\.port: cannot serve metrics on 127\.0\.0\.1:"
        ) as err:
            SinkMetrics("s", 30.0).serve(MetricsSettings(port=port))
    assert "fix:" in str(err.value)


def test_a_mirror_that_fails_never_stops_an_update() -> None:
    metrics = SinkMetrics("s", 30.0)

    def broken() -> None:
        raise RuntimeError("JVM gone")

    metrics.on_change = broken
    metrics.round_failed(TimeoutError())
    assert value(metrics, "fanout_sink_commit_round_failures_total") == 1


def test_a_commit_rounds_wall_time_is_a_histogram() -> None:
    metrics = SinkMetrics("s", 30.0)
    metrics.round_done(replace(round_of(None), seconds=1.5), [])
    metrics.round_done(replace(round_of(None), seconds=40.0), [])
    assert value(metrics, "fanout_sink_commit_round_duration_seconds_count") == 2
    assert value(metrics, "fanout_sink_commit_round_duration_seconds_sum") == 41.5
    assert value(metrics, "fanout_sink_commit_round_duration_seconds_bucket", le="2.5") == 1
