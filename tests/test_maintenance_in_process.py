"""Maintenance of small tables without Spark (``fanout_sink/maintenance/local_compaction.py`` and
``local_expiry.py``): the rows, the sink's floor and the files on disk are what Iceberg's
procedures leave, and a commit of the sink between the planning and the commit loses and doubles
nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from support.common import ARROW_SCHEMA, TABLE_SCHEMA, create_tables

from fanout_sink import cli
from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.maintenance import decisions, local_compaction, local_expiry
from fanout_sink.protocol import group_layout, orphans, table_state
from fanout_sink.spark import session
from fanout_sink.spark.maintenance import maintain_run


def _sink_commits(catalog: Any, name: str, start: int, count: int) -> Any:
    """``count`` one-row commits of sink ``s``, a file and a snapshot each, ids from ``start``."""
    for i in range(start, start + count):
        table = catalog.load_table(f"sink.{name}")
        props = table_state.summary_properties("s", {0: i + 1}, f"c{i}", None)
        table.append(pa.Table.from_pylist([{"id": i, "topic": "t"}], ARROW_SCHEMA), snapshot_properties=props)
    return catalog.load_table(f"sink.{name}")


def _ids(table: Any) -> list[int]:
    return sorted(table.scan().to_arrow()["id"].to_pylist())


def _files_on_disk(table: Any) -> set[str]:
    root = Path(table.location().removeprefix("file://"))
    return {orphans.normalise(str(p)) for p in root.rglob("*") if p.is_file() and p.suffix != ".json"}


def _metadata_names(table: Any) -> set[str]:
    return {p for p in orphans.reachable_files(table) if not p.endswith(".json")}


class _NoSpark:
    """A session that fails the test on any use: small tables are maintained without Spark."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Spark was used: spark.{name}")


def test_a_small_tables_maintenance_runs_without_spark_and_leaves_the_rows_the_floor_and_no_stray_file(
    catalog: Any, catalog_settings: CatalogSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_tables(catalog, ["day"])
    _sink_commits(catalog, "day", 0, 12)
    config = parse_config(
        {
            "name": "s",
            "source": {"topics": ["t"]},
            "catalog": catalog_settings.model_dump(),
            "maintenance": {"max-snapshot-age": "0s", "min-input-files": 5, "orphan-older-than": "1h"},
            "tables": {"sink.day": {}},
        }
    )
    monkeypatch.setattr(group_layout, "channel_in_use", lambda _config: None)
    monkeypatch.setattr(orphans, "pending_files", lambda _channel: set())
    run = maintain_run(_NoSpark(), config)
    (result,) = run.results
    assert result.ok, result.steps
    assert {s.name: s.action for s in result.steps} == {
        "compact": "ran",
        "deletes": "skipped",
        "manifests": "skipped",
        "expire": "ran",
        "orphans": "ran",
    }
    assert (result.before.data_files, result.after.data_files) == (12, 1)
    assert (result.before.snapshots, result.after.snapshots) == (12, 1)
    table = catalog.load_table("sink.day")
    assert _ids(table) == list(range(12))
    assert table.current_snapshot().summary.operation.value == "replace"
    assert table_state.read_state(table, "s").next_control_offset() == 12  # the floor outlived its snapshots
    assert table_state.MAINTENANCE_LAST_RUN_MS in table.metadata.properties
    # Expiry deleted what only the expired snapshots reached: the compacted files went with them.
    on_disk = _files_on_disk(table)
    assert on_disk <= _metadata_names(table)
    assert [p for p in on_disk if p.endswith(".parquet")] == [
        orphans.normalise(t.file.file_path) for t in table.scan().plan_files()
    ]


def test_a_sink_commit_between_planning_and_commit_is_kept_and_nothing_is_doubled(catalog: Any) -> None:
    create_tables(catalog, ["race"])
    _sink_commits(catalog, "race", 0, 6)
    loads = 0

    def load() -> Any:
        """The table as compaction plans it; the sink commits right after the first load."""
        nonlocal loads
        loads += 1
        table = catalog.load_table("sink.race")
        if loads == 1:
            _sink_commits(catalog, "race", 6, 1)
        return table

    done = local_compaction.compact(load, 1 << 20, 5)
    assert loads == 2  # the first plan lost to the sink's commit and was planned again
    assert done is not None and (done.rewritten_data_files_count, done.added_data_files_count) == (7, 1)
    table = catalog.load_table("sink.race")
    assert _ids(table) == list(range(7))
    assert table_state.read_state(table, "s").next_control_offset() == 7
    # The losing attempt's file was deleted: every data file on disk is named by a snapshot.
    data = {p for p in _files_on_disk(table) if p.endswith(".parquet")}
    assert data <= _metadata_names(table)


def test_expiry_racing_a_sink_commit_decides_again_and_deletes_none_of_its_files(catalog: Any) -> None:
    create_tables(catalog, ["exp"])
    table = _sink_commits(catalog, "exp", 0, 5)
    newest = max(s.timestamp_ms for s in table.metadata.snapshots) + 1
    real_load = catalog.load_table
    loads = 0

    def load_then_commit(identifier: Any) -> Any:
        nonlocal loads
        loads += 1
        loaded = real_load(identifier)
        if loads == 1:
            _sink_commits(catalog, "exp", 5, 1)
        return loaded

    catalog.load_table = load_then_commit
    try:
        done = local_expiry.expire(catalog, "sink.exp", newest, 1)
    finally:
        del catalog.load_table
    table = catalog.load_table("sink.exp")
    # Decided again: 4 of the 5 first, then the one the sink superseded too (its new one is kept).
    assert done.expired_snapshots == 5
    assert len(table.metadata.snapshots) == 1
    assert _ids(table) == list(range(6))
    assert _files_on_disk(table) <= _metadata_names(table)
    assert len([p for p in _files_on_disk(table) if p.endswith(".parquet")]) == 6  # none deleted


def test_two_maintainers_expiring_at_once_both_end_well(catalog: Any) -> None:
    """The schedule inside ``run`` and a ``fanout-sink maintain`` of the same tables: the expiry that
    loses decides again instead of removing snapshots that are gone."""
    create_tables(catalog, ["both"])
    table = _sink_commits(catalog, "both", 0, 5)
    newest = max(s.timestamp_ms for s in table.metadata.snapshots) + 1
    real_load = catalog.load_table
    other: list[local_expiry.Expired] = []

    def load_then_other_expires(identifier: Any) -> Any:
        loaded = real_load(identifier)
        if not other:
            del catalog.load_table  # the other maintainer loads as usual
            other.append(local_expiry.expire(catalog, "sink.both", newest, 1))
        return loaded

    catalog.load_table = load_then_other_expires
    done = local_expiry.expire(catalog, "sink.both", newest, 1)
    assert other[0].expired_snapshots == 4 and done.expired_snapshots == 0
    table = catalog.load_table("sink.both")
    assert len(table.metadata.snapshots) == 1 and _ids(table) == list(range(5))


def test_a_compaction_that_loses_to_another_maintainers_commits_nothing_of_its_own(catalog: Any) -> None:
    create_tables(catalog, ["twice"])
    _sink_commits(catalog, "twice", 0, 6)
    other: list[Any] = []

    def load() -> Any:
        table = catalog.load_table("sink.twice")
        if not other:
            other.append(local_compaction.compact(lambda: catalog.load_table("sink.twice"), 1 << 20, 5))
        return table

    done = local_compaction.compact(load, 1 << 20, 5)
    assert other[0].rewritten_data_files_count == 6 and done == local_compaction.Compacted(0, 0, 0)
    table = catalog.load_table("sink.twice")
    assert len(table.metadata.snapshots) == 7  # the sink's 6 and one replace: no empty one
    assert _ids(table) == list(range(6))


def test_fanout_sink_maintain_starts_no_spark_session_when_no_table_needs_one(
    catalog: Any,
    catalog_settings: CatalogSettings,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A scheduler's ``fanout-sink maintain`` over small tables: no driver JVM (seconds of CPU and
    hundreds of MB beside the sink) when every step runs in process."""
    create_tables(catalog, ["cron"])
    _sink_commits(catalog, "cron", 0, 6)
    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "kafka": {"bootstrap.servers": bootstrap_servers},
                "source": {"topics": ["t"]},
                "control": {"topic": make_topic("control")},
                "tables": {"sink.cron": {}},
                "catalog": catalog_settings.model_dump(),
                "maintenance": {"max-snapshot-age": "0s", "min-input-files": 5},
            }
        )
    )

    def no_session(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(session, "build_spark_session", no_session)
    assert cli.main(["maintain", "--config", str(config)]) == 0, capsys.readouterr()
    table = catalog.load_table("sink.cron")
    assert decisions.figures(table).data_files == 1 and _ids(table) == list(range(6))


def test_a_partitioned_tables_small_files_are_merged_per_partition_as_iceberg_merges_them(
    catalog: Any,
) -> None:
    """Each partition's small files into one file of that partition; a partition with fewer than
    ``min-input-files`` small files is left as it is (Iceberg's bin-pack picks the same)."""
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="topic")
    )
    catalog.create_namespace_if_not_exists("sink")
    catalog.create_table("sink.parts", schema=TABLE_SCHEMA, partition_spec=spec)
    for i, topic in enumerate(["a"] * 6 + ["b"] * 5 + ["c"] * 2):
        table = catalog.load_table("sink.parts")
        table.append(pa.Table.from_pylist([{"id": i, "topic": topic}], ARROW_SCHEMA))
    done = local_compaction.compact(lambda: catalog.load_table("sink.parts"), 1 << 20, 5)
    assert done is not None and (done.rewritten_data_files_count, done.added_data_files_count) == (11, 2)
    table = catalog.load_table("sink.parts")
    files = sorted((t.file.partition[0], t.file.record_count) for t in table.scan().plan_files())
    assert files == [("a", 6), ("b", 5), ("c", 1), ("c", 1)]
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": i, "topic": topic} for i, topic in enumerate(["a"] * 6 + ["b"] * 5 + ["c"] * 2)
    ]
