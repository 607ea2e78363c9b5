"""Exactly-once under real process deaths: children SIGKILLed at named fault points, then rows counted.

Each test runs the worker or the coordinator of a sink (``support.sink_factory``) in a child process
(``tests/support/run_<role>.py``), kills it with
SIGKILL at an exact step (``FANOUT_SINK_FAULTS``), restarts it, and ends with the exact ids per table.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.common import end_offset, produce_json, read_slice, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest, packed_sink

from fanout_sink.protocol import channel
from fanout_sink.spark import planning


def _setup(sink_factory: SinkFactory, partitions: int) -> tuple[SinkUnderTest, str, dict[str, list[int]]]:
    """A sink with tables a and b, ten records per partition, and Spark's batch 0 planned over them."""
    sink, expected = packed_sink(sink_factory, None, partitions, prefix="k")
    return sink, sink.topic, expected


def test_coordinator_killed_between_table_a_and_table_b(sink_factory: SinkFactory, catalog: Any) -> None:
    """I4: SIGKILL after sink.a's commit, before sink.b's; the restart commits b once and a not again."""
    sink, _topic, expected = _setup(sink_factory, 2)
    sink.run_child("worker")
    sink.run_child("coordinator", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == []

    outcomes = json.loads(sink.run_child("coordinator"))
    assert outcomes == {"sink.a": "already-committed", "sink.b": "committed"}
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]
    assert len(catalog.load_table("sink.a").snapshots()) == 1


def test_worker_killed_before_its_transaction_commits(
    sink_factory: SinkFactory, catalog: Any, tmp_path: Path
) -> None:
    """I2: files written, events sent, transaction still open: SIGKILL. Only orphan files remain."""
    sink, topic, expected = _setup(sink_factory, 2)
    sink.run_child("worker", "worker.before-commit=kill", expect=-signal.SIGKILL)
    assert sink.committed(topic, 0, stable=False) is None
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == [] and table_ids(catalog, "b") == []
    orphans = list((tmp_path / "warehouse").rglob("*.parquet"))
    assert orphans  # written, never appended

    sink.run_child("worker")  # the retry's init_transactions aborts the dead attempt's transaction
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_worker_killed_after_its_transaction_commits(sink_factory: SinkFactory, catalog: Any) -> None:
    """I1: partition 0's transaction commits, then SIGKILL before anyone learns; nothing is sent twice."""
    sink, topic, expected = _setup(sink_factory, 2)
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    assert sink.committed(topic, 0, stable=False) == 10 and sink.committed(topic, 1, stable=False) is None
    # Spark replays the killed batch with the ranges of its offset log: [0, 10) for both partitions.
    assert planning.planned_ranges(str(sink.checkpoint), 0) == {(topic, 0): (0, 10), (topic, 1): (0, 10)}
    report = json.loads(sink.run_child("worker"))
    assert [topic, 0, False, 10] in report  # the stable read finds [0, 10) delivered: skipped
    assert [topic, 1, True, 0] in report
    sink.done()
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_zombie_worker_process_is_fenced(sink_factory: SinkFactory, catalog: Any, tmp_path: Path) -> None:
    """I3: an older attempt (a live process) stalls with its transaction open; a newer attempt delivers;
    the older wakes up and must not commit."""
    sink, topic, expected = _setup(sink_factory, 1)
    release = tmp_path / "release-zombie"
    zombie = sink.start_child("worker", f"worker.before-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while not list((tmp_path / "warehouse").rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the zombie has written its files and is about to commit
    time.sleep(1.0)
    sink.run_child("worker")  # the newer attempt fences the zombie and delivers
    assert sink.committed(topic, 0, stable=False) == 10
    release.touch()
    _out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 1 and "ProducerFencedError" in err
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_counts_reconcile_across_a_killed_worker(
    sink_factory: SinkFactory, make_topic: Callable[..., str], catalog: Any
) -> None:
    """I5: good, malformed and filtered records; the worker dies after partition 0's transaction.
    After the retry: rows + dead letters + filtered = records in, each dead letter exactly once."""
    dlq = make_topic("dlq")
    sink = sink_factory(
        partitions={"src": 2}, tables="ab", prefix="k", overrides={"dead-letter": {"topic": dlq}}
    )
    topic, bootstrap_servers = sink.topic, sink.bootstrap
    good: dict[str, list[int]] = {"a": [], "b": []}
    bad = skipped = 0
    for partition in range(2):
        values: list[dict[str, Any] | bytes] = []
        for i in range(12):
            ident = partition * 100 + i
            if i % 4 == 3:
                values.append(f"garbage-{ident}".encode())
                bad += 1
            elif i % 4 == 2:
                values.append({"id": ident, "table": "skip"})
                skipped += 1
            else:
                values.append({"id": ident, "table": "ab"[i % 2]})
                good["ab"[i % 2]].append(ident)
        produce_json(bootstrap_servers, topic, partition, values)
    sink.plan()
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    sink.run_child("worker")
    sink.run_child("coordinator")

    rows = table_ids(catalog, "a") + table_ids(catalog, "b")
    assert table_ids(catalog, "a") == good["a"] and table_ids(catalog, "b") == good["b"]
    letters = read_slice(bootstrap_servers, dlq, 0, 0, end_offset(bootstrap_servers, dlq, 0))
    assert sorted(letters["value"].to_pylist()) == sorted(
        f"garbage-{p * 100 + i}".encode() for p in range(2) for i in range(12) if i % 4 == 3
    )
    records_in = sum(end_offset(bootstrap_servers, topic, p) for p in range(2))
    assert records_in == len(rows) + letters.num_rows + skipped == 24


def test_two_coordinator_processes_of_one_sink(
    sink_factory: SinkFactory, catalog: Any, tmp_path: Path
) -> None:
    """I3: coordinator 1 loads sink.a and stalls before committing; coordinator 2 starts (fencing 1)
    and commits everything; coordinator 1 wakes up: its commit conflicts, the re-check finds the
    files already in the table, and its next Kafka transaction fails as fenced."""
    sink, _topic, expected = _setup(sink_factory, 2)
    sink.run_child("worker")
    release = tmp_path / "release-first-coordinator"
    first = sink.start_child("coordinator", f"coordinator.before-table-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the first one has started its round
        reader = channel.ControlReader(sink.channel)
        reader.seek(0)
        started = any(
            type(e.event.payload).__name__ == "StartCommit" for e in reader.read_until(reader.end_offset())
        )
        reader.close()
        if started:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    assert json.loads(sink.run_child("coordinator")) == {"sink.a": "committed", "sink.b": "committed"}
    release.touch()
    _out, err = first.communicate(timeout=120)
    assert first.returncode == 1 and "ProducerFencedError" in err
    for name in "ab":
        assert table_ids(catalog, name) == expected[name]
        assert len(catalog.load_table(f"sink.{name}").snapshots()) == 1


def test_replayed_batch_overlapping_a_killed_attempt_delivers_only_the_rest(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """I1 (overlap) under a real SIGKILL: batch 0 planned [0, 10), partition 0's transaction commits,
    the worker dies. The checkpoint comes back without that batch's offset log (restored from a
    backup taken before it), so Spark plans batch 0 again, now up to 15: [0, 15) overlaps the
    delivered [0, 10). The worker must drop the delivered head and deliver [10, 15) once."""
    sink, topic, expected = _setup(sink_factory, 2)
    sink.run_child("worker", "worker.after-commit=kill", expect=-signal.SIGKILL)
    assert sink.committed(topic, 0, stable=False) == 10
    for partition in range(2):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10, 15)]
        produce_json(sink.bootstrap, topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    (sink.checkpoint / "offsets" / "0").unlink()  # the restored backup predates batch 0's plan
    assert sink.plan() == {(topic, 0): (0, 15), (topic, 1): (0, 15)}

    report = json.loads(sink.run_child("worker"))
    assert [topic, 0, True, 10] in report  # [0, 10) skipped as delivered, [10, 15) committed
    sink.done()
    assert sink.committed(topic, 0, stable=False) == 15 and sink.committed(topic, 1, stable=False) == 15
    sink.run_child("coordinator")
    assert table_ids(catalog, "a") == sorted(expected["a"])
    assert table_ids(catalog, "b") == sorted(expected["b"])
