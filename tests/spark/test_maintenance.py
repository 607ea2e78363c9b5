"""``maintain`` on real tables through the shared Spark session: each step runs only where it pays,
the sink's floor survives the expiry of its snapshots, and a dry run changes nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.common import ARROW_SCHEMA, create_tables

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config import parse_config
from fanout_sink.protocol import table_state
from fanout_sink.spark.maintenance import maintain

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _append(table: Any, ident: int, props: dict[str, str]) -> None:
    table.append(pa.Table.from_pylist([{"id": ident, "topic": "t"}], ARROW_SCHEMA), snapshot_properties=props)


def _stray(table: Any, name: str, age_s: float) -> Path:
    path = Path(table.location().removeprefix("file://")) / "data" / name
    pq.write_table(pa.Table.from_pylist([{"id": -1, "topic": "x"}], ARROW_SCHEMA), path)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_maintain_compacts_expires_and_keeps_the_sinks_floor(
    spark: Any,
    spark_catalog: str,
    catalog: Any,
    catalog_settings: CatalogSettings,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
) -> None:
    create_tables(catalog, ["events", "quiet", "other"])
    events = catalog.load_table("sink.events")
    for i in range(6):  # a sink that kept its floor in snapshot summaries only (before table properties)
        _append(events, i, table_state.summary_properties("s", {0: i + 1}, f"c{i}", None))
    quiet = catalog.load_table("sink.quiet")
    for i in range(3):
        _append(quiet, i, table_state.summary_properties("s", {0: i + 1}, f"q{i}", None))
    _append(catalog.load_table("sink.other"), 0, {})  # not the sink's: never maintained
    orphan, fresh = _stray(events, "aborted.parquet", 7200), _stray(events, "in-flight.parquet", 0)
    config = parse_config(
        {
            "name": "s",
            "kafka": {"bootstrap.servers": bootstrap_servers},
            "source": {"topics": ["t"]},
            "control": {"topic": make_topic("control")},
            "catalog": catalog_settings.model_dump(),
            "maintenance": {"min-input-files": 3, "orphan-older-than": "1h"},
            "tables": {
                "sink.events": {"maintenance": {"max-snapshot-age": "0s"}},
                "sink.quiet": {"maintenance": {"min-input-files": 5, "rewrite-manifests-min-count": 2}},
            },
        }
    )

    dry = {r.table: r for r in maintain(spark, config, dry_run=True)}
    assert sorted(dry) == ["sink.events", "sink.quiet"]
    assert {s.name: s.action for s in dry["sink.events"].steps} == {
        "compact": "dry-run",
        "manifests": "skipped",
        "expire": "dry-run",
        "orphans": "dry-run",
    }
    assert dry["sink.events"].orphans_removed == (f"{orphan}",) and orphan.exists()
    assert dry["sink.events"].after == dry["sink.events"].before

    results = {r.table: r for r in maintain(spark, config)}
    ran = results["sink.events"]
    assert {s.name: s.action for s in ran.steps} == {
        "compact": "ran",
        "manifests": "skipped",
        "expire": "ran",
        "orphans": "ran",
        # no "last-run" step: it is recorded only when it fails
    }
    assert (ran.before.data_files, ran.after.data_files) == (6, 1)
    assert (ran.before.snapshots, ran.after.snapshots) == (6, 1)
    assert ran.floor_written[table_state.key("s", "commit-id")] == "c5"
    assert ran.orphans_removed == (f"{orphan}",) and not orphan.exists() and fresh.exists()
    events = catalog.load_table("sink.events")
    assert table_state.read_state(events, "s").next_control_offset() == 6  # the floor outlived its snapshots
    assert sorted(events.scan().to_arrow()["id"].to_pylist()) == list(range(6))
    assert table_state.MAINTENANCE_LAST_RUN_MS in events.metadata.properties

    steps = {s.name: s for s in results["sink.quiet"].steps}
    assert steps["compact"].action == "skipped" and "min-input-files 5" in steps["compact"].detail
    assert steps["manifests"].action == "ran" and results["sink.quiet"].after.manifests == 1
    assert steps["expire"].action == "skipped"
    assert results["sink.quiet"].after.snapshots == 4  # the manifest rewrite is a snapshot
    assert "fanout-sink.maintenance.last-run-ms" not in catalog.load_table("sink.other").metadata.properties
