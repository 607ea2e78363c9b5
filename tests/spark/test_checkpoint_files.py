"""The planner reads a checkpoint the same way on local disk (Python I/O) and through Hadoop's
FileSystem in the driver JVM (any scheme: here ``file://``, which needs no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout_sink.spark import planning

TOPIC = "orders"


def _offset_log(path: Path, offsets: dict[int, int]) -> None:
    """An offset log file as Spark writes it: version lines, then the Kafka source's JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({TOPIC: {str(p): o for p, o in offsets.items()}})
    path.write_text(f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":0}}\n{body}\n')


def _checkpoint(root: Path) -> None:
    _offset_log(root / "sources" / "0" / "0", {0: 0, 1: 4})
    _offset_log(root / "offsets" / "0", {0: 10, 1: 4})
    _offset_log(root / "offsets" / "1", {0: 15, 1: 9, 2: 3})  # partition 2 appeared in batch 1
    (root / "commits").mkdir()
    (root / "commits" / "0").write_text("v1\n{}\n")


def test_hadoop_reader_agrees_with_the_local_one(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "ck" / "sink"
    _checkpoint(root)
    for location in (str(root), f"file://{root}", "relative/ck"):
        assert isinstance(planning.open_checkpoint(location, spark), planning.LocalCheckpoint)
    assert not any(map(planning.is_local_checkpoint, ["s3a://b/ck", "hdfs://nn:8020/ck", "abfss://c@a/ck"]))
    via_hadoop = planning.HadoopCheckpoint(f"file://{root}", spark)
    local = planning.LocalCheckpoint(str(root))
    assert sorted(via_hadoop.names("offsets")) == sorted(local.names("offsets")) == ["0", "1"]
    assert via_hadoop.read("offsets", "1") == local.read("offsets", "1")
    assert via_hadoop.read("offsets", "7") is None and via_hadoop.names("nothing") == []

    moved = via_hadoop.move_aside("sink.stale-1")
    assert not root.exists() and (tmp_path / "ck" / "sink.stale-1" / "offsets" / "1").is_file()
    assert moved.endswith("/ck/sink.stale-1")
    assert not via_hadoop.exists()


def test_a_remote_checkpoint_without_a_session_is_a_clear_error() -> None:
    with pytest.raises(planning.CheckpointError, match="fix: pass the session"):
        planning.planned_ranges("s3a://bucket/checkpoints/sink", 0)


def test_reconcile_moves_a_hadoop_checkpoint_aside(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every planner entry point routes non-local schemes through Hadoop: prove it with a scheme only
    Hadoop serves here (``file://`` is taken for local, so the local test is bypassed)."""
    root = tmp_path / "ck2" / "sink"
    _checkpoint(root)
    monkeypatch.setattr(planning, "is_local_checkpoint", lambda location: False)
    location = f"file://{root}"
    assert planning.planned_ranges(location, 0, spark) == {(TOPIC, 0): (0, 10), (TOPIC, 1): (4, 4)}
    assert planning.planned_ranges(location, 1, spark) == {
        (TOPIC, 0): (10, 15),
        (TOPIC, 1): (4, 9),
        (TOPIC, 2): (0, 3),
    }
    assert planning.last_committed_ends(location, spark) == {(TOPIC, 0): 10, (TOPIC, 1): 4}
    planning.reconcile_checkpoint(location, {(TOPIC, 0): 3, (TOPIC, 1): 4}, spark)  # ahead on partition 0
    assert not root.exists()
    assert [p.name.startswith("sink.stale-") for p in (tmp_path / "ck2").iterdir()] == [True]
