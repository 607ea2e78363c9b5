"""Exactly-once under real process deaths: children SIGKILLed at named fault points, then rows counted.

Each test runs the worker or the coordinator in a child process (``tests/support``), kills it with
SIGKILL at an exact step (``FANOUT_SINK_FAULTS``), restarts it, and ends with the exact ids per table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.common import (
    commit_checkpoint_batch,
    create_tables,
    end_offset,
    produce_json,
    read_slice,
    sink_group_offset,
    table_ids,
    write_checkpoint_batch,
)

from fanout_sink.catalog import CatalogSettings
from fanout_sink.protocol import channel
from fanout_sink.spark import planning

PROCS = Path(__file__).parents[1] / "support"


class Child:
    """Runs the worker or coordinator scripts of one sink in child processes.

    The worker replays batch ``self.batch`` of a Spark checkpoint written the way Spark writes it:
    :meth:`plan` is Spark writing ``offsets/<batch>`` before running the batch, :meth:`done` is
    ``commits/<batch>`` after ``foreachBatch`` returned. A killed worker's batch has no commit
    marker, so the next run replays the same ranges, as Spark does after a crash.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, int],
        settings: CatalogSettings,
        checkpoint: Path,
        dlq: str | None = None,
    ) -> None:
        self.sink = f"k{uuid.uuid4().hex[:6]}"
        self.bootstrap = bootstrap
        self.topics = topics
        self.checkpoint = checkpoint
        self.batch = 0
        self.settings = {
            "bootstrap": bootstrap,
            "sink": self.sink,
            "control": f"{self.sink}-control",
            "topics": topics,
            "catalog": settings.model_dump(),
            "dlq": dlq,
            "checkpoint": str(checkpoint),
        }

    def plan(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Spark plans the current batch: up to each partition's last stable offset now."""
        ends = {t: {p: end_offset(self.bootstrap, t, p) for p in range(n)} for t, n in self.topics.items()}
        write_checkpoint_batch(self.checkpoint, self.batch, ends, committed=False)
        return planning.planned_ranges(str(self.checkpoint), self.batch)

    def done(self) -> None:
        """``foreachBatch`` returned: Spark marks the batch done and moves on to the next."""
        commit_checkpoint_batch(self.checkpoint, self.batch)
        self.batch += 1

    def start(self, script: str, faults: str = "") -> subprocess.Popen[str]:
        env = {**os.environ, "FANOUT_SINK_FAULTS": faults}
        config = json.dumps({**self.settings, "batch": self.batch})
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(PROCS / script), config],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, script: str, faults: str = "", expect: int = 0) -> str:
        proc = self.start(script, faults)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == expect, (
            f"{script} exited {proc.returncode}, wanted {expect}:\n{err[-3000:]}"
        )
        return out

    def committed(self, topic: str, partition: int) -> int | None:
        """Without waiting for pending transactions (a killed attempt's stays open until fenced)."""
        return sink_group_offset(self.bootstrap, self.sink, topic, partition, stable=False)


def _setup(
    bootstrap: str,
    make_topic: Callable[..., str],
    catalog: Any,
    settings: CatalogSettings,
    partitions: int,
    tmp_path: Path,
) -> tuple[Child, str, dict[str, list[int]]]:
    topic = make_topic("src", partitions=partitions)
    create_tables(catalog, ["a", "b"])
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(partitions):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10)]
        produce_json(bootstrap, topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    child = Child(bootstrap, {topic: partitions}, settings, tmp_path / "checkpoint")
    child.plan()
    return child, topic, {t: sorted(v) for t, v in expected.items()}


def test_coordinator_killed_between_table_a_and_table_b(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I4: SIGKILL after sink.a's commit, before sink.b's; the restart commits b once and a not again."""
    child, _topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 2, tmp_path)
    child.run("run_worker.py")
    child.run("run_coordinator.py", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == []

    outcomes = json.loads(child.run("run_coordinator.py"))
    assert outcomes == {"sink.a": "already-committed", "sink.b": "committed"}
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]
    assert len(catalog.load_table("sink.a").snapshots()) == 1


def test_worker_killed_before_its_transaction_commits(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I2: files written, events sent, transaction still open: SIGKILL. Only orphan files remain."""
    child, topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 2, tmp_path)
    child.run("run_worker.py", "worker.before-commit=kill", expect=-signal.SIGKILL)
    assert child.committed(topic, 0) is None
    child.run("run_coordinator.py")
    assert table_ids(catalog, "a") == [] and table_ids(catalog, "b") == []
    orphans = list((tmp_path / "warehouse").rglob("*.parquet"))
    assert orphans  # written, never appended

    child.run("run_worker.py")  # the retry's init_transactions aborts the dead attempt's transaction
    child.run("run_coordinator.py")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_worker_killed_after_its_transaction_commits(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I1: partition 0's transaction commits, then SIGKILL before anyone learns; nothing is sent twice."""
    child, topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 2, tmp_path)
    child.run("run_worker.py", "worker.after-commit=kill", expect=-signal.SIGKILL)
    assert child.committed(topic, 0) == 10 and child.committed(topic, 1) is None
    # Spark replays the killed batch with the ranges of its offset log: [0, 10) for both partitions.
    assert planning.planned_ranges(str(child.checkpoint), 0) == {(topic, 0): (0, 10), (topic, 1): (0, 10)}
    report = json.loads(child.run("run_worker.py"))
    assert [topic, 0, False, 10] in report  # the stable read finds [0, 10) delivered: skipped
    assert [topic, 1, True, 0] in report
    child.done()
    child.run("run_coordinator.py")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_zombie_worker_process_is_fenced(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I3: an older attempt (a live process) stalls with its transaction open; a newer attempt delivers;
    the older wakes up and must not commit."""
    child, topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 1, tmp_path)
    release = tmp_path / "release-zombie"
    zombie = child.start("run_worker.py", f"worker.before-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while not list((tmp_path / "warehouse").rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the zombie has written its files and is about to commit
    time.sleep(1.0)
    child.run("run_worker.py")  # the newer attempt fences the zombie and delivers
    assert child.committed(topic, 0) == 10
    release.touch()
    _out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 1 and "ProducerFencedError" in err
    child.run("run_coordinator.py")
    assert table_ids(catalog, "a") == expected["a"]
    assert table_ids(catalog, "b") == expected["b"]


def test_counts_reconcile_across_a_killed_worker(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I5: good, malformed and filtered records; the worker dies after partition 0's transaction.
    After the retry: rows + dead letters + filtered = records in, each dead letter exactly once."""
    topic, dlq = make_topic("src", partitions=2), make_topic("dlq")
    create_tables(catalog, ["a", "b"])
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
    child = Child(bootstrap_servers, {topic: 2}, catalog_settings, tmp_path / "checkpoint", dlq=dlq)
    child.plan()
    child.run("run_worker.py", "worker.after-commit=kill", expect=-signal.SIGKILL)
    child.run("run_worker.py")
    child.run("run_coordinator.py")

    rows = table_ids(catalog, "a") + table_ids(catalog, "b")
    assert table_ids(catalog, "a") == good["a"] and table_ids(catalog, "b") == good["b"]
    letters = read_slice(bootstrap_servers, dlq, 0, 0, end_offset(bootstrap_servers, dlq, 0))
    assert sorted(letters["value"].to_pylist()) == sorted(
        f"garbage-{p * 100 + i}".encode() for p in range(2) for i in range(12) if i % 4 == 3
    )
    records_in = sum(end_offset(bootstrap_servers, topic, p) for p in range(2))
    assert records_in == len(rows) + letters.num_rows + skipped == 24


def test_two_coordinator_processes_of_one_sink(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I3: coordinator 1 loads sink.a and stalls before committing; coordinator 2 starts (fencing 1)
    and commits everything; coordinator 1 wakes up: its commit conflicts, the re-check finds the
    files already in the table, and its next Kafka transaction fails as fenced."""
    child, _topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 2, tmp_path)
    child.run("run_worker.py")
    release = tmp_path / "release-first-coordinator"
    first = child.start("run_coordinator.py", f"coordinator.before-table-commit=wait:{release}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the first one has started its round
        reader = channel.ControlReader(
            channel.SinkChannel(child.sink, {"bootstrap.servers": bootstrap_servers}, f"{child.sink}-control")
        )
        reader.seek(0)
        started = any(
            type(e.event.payload).__name__ == "StartCommit" for e in reader.read_until(reader.end_offset())
        )
        reader.close()
        if started:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    assert json.loads(child.run("run_coordinator.py")) == {"sink.a": "committed", "sink.b": "committed"}
    release.touch()
    _out, err = first.communicate(timeout=120)
    assert first.returncode == 1 and "ProducerFencedError" in err
    for name in "ab":
        assert table_ids(catalog, name) == expected[name]
        assert len(catalog.load_table(f"sink.{name}").snapshots()) == 1


def test_replayed_batch_overlapping_a_killed_attempt_delivers_only_the_rest(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """I1 (overlap) under a real SIGKILL: batch 0 planned [0, 10), partition 0's transaction commits,
    the worker dies. The checkpoint comes back without that batch's offset log (restored from a
    backup taken before it), so Spark plans batch 0 again, now up to 15: [0, 15) overlaps the
    delivered [0, 10). The worker must drop the delivered head and deliver [10, 15) once."""
    child, topic, expected = _setup(bootstrap_servers, make_topic, catalog, catalog_settings, 2, tmp_path)
    child.run("run_worker.py", "worker.after-commit=kill", expect=-signal.SIGKILL)
    assert child.committed(topic, 0) == 10
    for partition in range(2):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10, 15)]
        produce_json(bootstrap_servers, topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    (child.checkpoint / "offsets" / "0").unlink()  # the restored backup predates batch 0's plan
    assert child.plan() == {(topic, 0): (0, 15), (topic, 1): (0, 15)}

    report = json.loads(child.run("run_worker.py"))
    assert [topic, 0, True, 10] in report  # [0, 10) skipped as delivered, [10, 15) committed
    child.done()
    assert child.committed(topic, 0) == 15 and child.committed(topic, 1) == 15
    child.run("run_coordinator.py")
    assert table_ids(catalog, "a") == sorted(expected["a"])
    assert table_ids(catalog, "b") == sorted(expected["b"])
