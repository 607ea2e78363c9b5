"""Per-table commit cadence (issue 50 item 2) on the real broker and catalog: a hot table commits
every round, a cold one only in the first round of its period or a stop's final round, its rows
exact, its small files merged into fewer at that commit; every test ends with the exact ids."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from support.common import produce_json, table_ids
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.protocol import channel, round_trigger
from fanout_sink.protocol import events as ev
from fanout_sink.protocol.commit_state import PendingFiles
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings
from fanout_sink.protocol.table_cadence import CommitIntervals, TableCadence, due_ms, phase_ms

DECADE_S = 3650 * 86400.0
"""The cold table's interval: no period boundary passes while a test runs unless the test's clock
moves past one."""


class Clock:
    """Wall-clock seconds that a test moves forward (the events' write times stay real)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _written(*seconds: float) -> list[PendingFiles]:
    table = ev.TableRef(namespace=("n",), name="t", uuid="u")
    event = ev.DataWritten(table=table, files=(), topic="s", partition=0, next_offset=1)
    return [PendingFiles(i, event, int(at * 1000)) for i, at in enumerate(seconds)]


def test_a_table_is_due_in_the_first_round_of_a_period_or_once_its_files_are_older_than_the_period() -> None:
    """The rule without a broker: n.cold's periods of 60 s from the epoch shifted by its phase ``p``
    (:func:`phase_ms`); the coordinator started at 1000 s + p. Every time below is shifted by p."""
    p = phase_ms("n.cold", 60.0) / 1000
    clock = Clock()
    clock.now = 1000.0 + p
    cadence = TableCadence(CommitIntervals(declared={"n.hot": None}, dynamic_s=60.0), clock)

    def split(now: float, reason: str = round_trigger.CALL, failing: tuple[str, ...] = ()) -> set[str]:
        due = {"n.hot": _written(now + p - 1), "n.cold": files}
        return set(cadence.split(due, now + p, reason, failing)[0])

    files = _written(1005 + p)
    assert split(1010) == {"n.hot"}  # period [960, 1020) + p: the cold files wait
    assert split(1010, round_trigger.STOP) == {"n.hot", "n.cold"}  # a stop commits everything
    assert split(1010, failing=("n.cold",)) == {"n.hot", "n.cold"}  # a failed commit is retried
    assert split(1025) == {"n.hot", "n.cold"}  # the first round of [1020, 1080) + p
    files = _written(1021 + p)  # written after the boundary, before that first round: all go together
    assert split(1025) == {"n.hot", "n.cold"}
    cadence.ran(1025 + p)
    files = _written(1018 + p, 1030 + p)  # one written before this period began: due at any round
    assert split(1040) == {"n.hot", "n.cold"}
    files = _written(1030 + p)
    assert split(1050) == {"n.hot"}  # written in this period, after its first round
    assert split(1081) == {"n.hot", "n.cold"}
    written_ms = round((1030 + p) * 1000)
    assert due_ms("n.cold", 60.0, written_ms, written_ms) == 1_080_000 + phase_ms("n.cold", 60.0)
    assert cadence.merging(["n.hot", "n.cold", "raw.x"]) == {"n.cold", "raw.x"}


def test_the_tables_of_one_interval_spread_their_commits_over_it_each_once_a_period() -> None:
    """120 tables of a 60 s interval, rounds every 10 s for two periods, every table writing a file
    in every round: each commits once a period, at the round ``status``'s due time names, and the
    commits spread over the period's rounds. Counted from the epoch alone, all 120 committed in one
    round of six (the herd: 4,750 tables and their file merges in one round at 5,000 tables)."""
    clock = Clock()
    clock.now = 6000.0  # a multiple of the interval: the epoch's periods begin here
    tables = [f"raw.t{i}" for i in range(120)]
    cadence = TableCadence(CommitIntervals(dynamic_s=60.0), clock)
    oldest: dict[str, float] = {}
    announced: dict[str, int] = {}
    commits: dict[str, list[int]] = {t: [] for t in tables}
    per_round = []
    for now in range(6010, 6121, 10):
        for table in tables:
            oldest.setdefault(table, now - 5.0)  # a file written since the previous round
        due = {table: _written(oldest[table]) for table in tables}
        committing, waiting = cadence.split(due, float(now), round_trigger.CALL)
        cadence.ran(float(now))
        per_round.append(len(committing))
        for table in committing:
            del oldest[table]
            commits[table].append(now)
            if table in announced:  # status's due time of its waiting files: this round's
                assert (now - 10) * 1000 < announced.pop(table) <= now * 1000
        for table in waiting:
            written_ms = round(oldest[table] * 1000)
            announced[table] = due_ms(table, 60.0, written_ms, now * 1000)
            assert announced[table] > now * 1000
    assert all(len(at) == 2 and at[1] - at[0] == 60 for at in commits.values())  # once a period
    assert sum(per_round) == 240 and max(per_round) <= 40, per_round  # ~20 a round, not 120 in one


def _cold_b(sink: SinkUnderTest, clock: Clock) -> Coordinator:
    """A coordinator of a sink whose sink.a commits every round and sink.b once a decade."""
    cadence = TableCadence(CommitIntervals(declared={"sink.a": None, "sink.b": DECADE_S}), clock)
    return sink.coordinator(cadence=cadence)


def _produce(sink: SinkUnderTest, ids: range) -> dict[str, list[int]]:
    """Ids over both partitions, alternating tables a and b; returns ids per table."""
    expected: dict[str, list[int]] = {"a": [], "b": []}
    per_partition: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for i in ids:
        table = "ab"[i % 2]
        per_partition[(i // 2) % 2].append({"id": i, "table": table})
        expected[table].append(i)
    for partition, values in per_partition.items():
        produce_json(sink.bootstrap, sink.topic, partition, values)
    return expected


def _low_watermark(sink: SinkUnderTest) -> int:
    holder = Consumer({**sink.kafka, "group.id": channel.coordinator_group(sink.name)})
    try:
        return int(holder.committed([TopicPartition(sink.control_topic, 0)], timeout=30)[0].offset)
    finally:
        holder.close()


def test_a_cold_table_waits_for_its_period_while_the_hot_one_commits_every_round(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="cad")
    clock = Clock()
    coordinator = _cold_b(sink, clock)
    expected = _produce(sink, range(20))
    sink.batch()
    first = coordinator.commit_round()
    assert {t: o.outcome for t, o in first.tables.items()} == {"sink.a": "committed"}
    assert first.waiting == {"sink.b"}
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == []
    # sink.b's files hold the control topic's low watermark; a round where a table waits is no
    # consistent point (sql --consistent must not read sink.b there).
    assert _low_watermark(sink) < first.round_end
    summary = catalog.load_table("sink.a").current_snapshot().summary
    assert f"fanout-sink.{sink.name}.round-tables" not in summary.additional_properties

    more = _produce(sink, range(20, 40))
    sink.batch()
    second = coordinator.commit_round()
    assert set(second.tables) == {"sink.a"} and second.waiting == {"sink.b"}
    assert table_ids(catalog, "a") == expected["a"] + more["a"] and table_ids(catalog, "b") == []

    clock.now += DECADE_S  # sink.b's period ends: the next round commits everything it gathered
    third = coordinator.commit_round()
    assert {t: o.outcome for t, o in third.tables.items()} == {"sink.b": "committed"}
    assert third.waiting == frozenset()
    assert table_ids(catalog, "b") == expected["b"] + more["b"]
    cold = catalog.load_table("sink.b")
    assert len(cold.snapshots()) == 1
    # Two batches of two partitions wrote four small files for sink.b: merged into one at its commit.
    assert third.tables["sink.b"].merged_files == 4 and third.tables["sink.b"].files == 1
    assert int(cold.current_snapshot().summary["total-data-files"]) == 1
    assert len(catalog.load_table("sink.a").snapshots()) == 2
    assert _low_watermark(sink) == third.round_end
    assert f"fanout-sink.{sink.name}.round-tables" in cold.current_snapshot().summary.additional_properties

    assert coordinator.commit_round().tables == {}  # nothing left: no snapshot anywhere
    assert len(catalog.load_table("sink.b").snapshots()) == 1
    coordinator.close()


def test_a_stop_commits_a_cold_table_before_its_period_ends(sink_factory: SinkFactory, catalog: Any) -> None:
    """The final round of a stop commits every table, so a clean stop leaves nothing pending."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="cad")
    coordinator = _cold_b(sink, Clock())
    expected = _produce(sink, range(10))
    sink.batch()
    assert coordinator.commit_round().waiting == {"sink.b"}
    final = coordinator.commit_round(round_trigger.STOP)
    assert final.tables["sink.b"].outcome == "committed" and final.waiting == frozenset()
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]
    assert _low_watermark(sink) == final.round_end
    coordinator.close()


def test_the_coordinator_settings_carry_each_tables_own_interval(sink_factory: SinkFactory) -> None:
    """From the YAML: a route's commit-interval, dynamic's for the tables it names, none otherwise."""
    sink = sink_factory(
        partitions={"src": 1},
        tables="ab",
        prefix="cad",
        overrides={
            "tables": {
                "sink.a": {"when": "table == 'a'"},
                "sink.b": {"when": "table == 'b'", "commit-interval": "5m"},
            },
            "dynamic": {"table": "join('.', ['raw', table])", "commit-interval": "1h"},
        },
    )
    intervals = CoordinatorSettings.of(sink.config).commit_intervals
    assert [intervals.interval_s(t) for t in ("sink.a", "sink.b", "raw.c")] == [None, 300.0, 3600.0]


def _cold_interval(sink: SinkUnderTest, interval: str) -> None:
    """sink.b's own commit-interval in the sink's YAML (the control topic keeps every event)."""
    data = yaml.safe_load(sink.config_file.read_text())
    data["control"]["retention-ms"] = -1
    data["tables"]["sink.b"]["commit-interval"] = interval
    sink.config_file.write_text(yaml.safe_dump(data))


def _deliver(sink: SinkUnderTest, ids: range, expected: dict[str, list[int]]) -> None:
    """Produce ``ids``, plan Spark's next batch and run it in a worker child."""
    for table, got in _produce(sink, ids).items():
        expected[table] += got
    sink.plan()
    sink.run_child("worker")
    sink.done()


def test_coordinator_processes_killed_mid_round_with_tables_on_different_cadences(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """Exactly once through SIGKILLs (real child processes): sink.a commits every round, sink.b's
    files wait two batches; in sink.b's due round the coordinator is killed after sink.a's commit,
    then again after sink.b's merged files are written, before its commit; the restart commits
    sink.b once, from the originals still pending (the merged files of the killed attempt are
    orphans), and sink.a nothing twice."""
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="cadk")
    _cold_interval(sink, "3650d")  # no period ends while the test runs
    expected: dict[str, list[int]] = {"a": [], "b": []}
    _deliver(sink, range(20), expected)
    assert json.loads(sink.run_child("coordinator")) == {"sink.a": "committed"}  # sink.b waits
    assert table_ids(catalog, "a") == sorted(expected["a"]) and table_ids(catalog, "b") == []

    _deliver(sink, range(20, 40), expected)
    _cold_interval(sink, "2s")  # sink.b's period ends: its next round commits what it gathered
    time.sleep(2.0)
    sink.run_child("coordinator", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    assert table_ids(catalog, "b") == []  # killed right after sink.a's commit (one commit thread)
    sink.run_child("coordinator", "coordinator.after-merge=kill", expect=-signal.SIGKILL)
    assert table_ids(catalog, "b") == []
    outcomes = json.loads(sink.run_child("coordinator"))
    assert outcomes == {"sink.a": "already-committed", "sink.b": "committed"}
    assert table_ids(catalog, "a") == sorted(expected["a"])
    assert table_ids(catalog, "b") == sorted(expected["b"])
    cold = catalog.load_table("sink.b")
    assert len(cold.snapshots()) == 1 and int(cold.current_snapshot().summary["total-data-files"]) == 1
    assert len(catalog.load_table("sink.a").snapshots()) == 2
