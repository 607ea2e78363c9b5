"""The coordinator on the real broker and catalog; every test ends with the exact ids per table."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from support.common import (
    ARROW_SCHEMA,
    NAMESPACE,
    TABLE_SCHEMA,
    create_named_topic,
    end_offset,
    make_processor,
    produce_json,
    read_slice,
    run_planned_batch,
    table_ids,
)
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.config.loading import parse_config
from fanout_sink.errors import ProducerFencedError
from fanout_sink.kafka.offsets import PartitionPosition
from fanout_sink.protocol import channel, round_trigger, table_state
from fanout_sink.protocol.coordinator import CoordinatorSettings, RoundResult
from fanout_sink.protocol.round_trigger import RoundTrigger
from fanout_sink.protocol.slices import Slice


def _sink(sink_factory: SinkFactory, topics: int, partitions: int) -> SinkUnderTest:
    """A sink of ``topics`` source topics of ``partitions`` each, with tables a, b and c."""
    return sink_factory(partitions={f"src{i}": partitions for i in range(topics)}, tables="abc", prefix="s")


def _produce(sink: SinkUnderTest, ids: range, tables: str = "abc") -> dict[str, list[int]]:
    """Spread ids over every source partition, routed round-robin to ``tables``; returns ids per table."""
    expected: dict[str, list[int]] = {t: [] for t in "abc"}
    partitions = [(t, p) for t, n in sink.partitions.items() for p in range(n)]
    per_partition: dict[tuple[str, int], list[dict[str, Any]]] = {tp: [] for tp in partitions}
    for i in ids:
        table = tables[i % len(tables)]
        per_partition[partitions[i % len(partitions)]].append({"id": i, "table": table})
        expected[table].append(i)
    for (topic, partition), values in per_partition.items():
        produce_json(sink.bootstrap, topic, partition, values)
    return expected


def _snapshots(catalog: Any, name: str) -> int:
    return len(catalog.load_table(f"{NAMESPACE}.{name}").snapshots())


def test_happy_path_two_topics_three_partitions_three_tables(sink_factory: SinkFactory, catalog: Any) -> None:
    sink = _sink(sink_factory, topics=2, partitions=3)
    coordinator = sink.coordinator()
    expected = _produce(sink, range(60))
    sink.batch()
    result = coordinator.commit_round()
    assert {t: o.outcome for t, o in result.tables.items()} == {f"sink.{t}": "committed" for t in "abc"}
    for name in "abc":
        assert table_ids(catalog, name) == expected[name]
    # Everything delivered: VTTS is the newest record timestamp, and it is in every table's summary.
    assert result.vtts_ms is not None
    state = table_state.read_state(catalog.load_table("sink.a"), sink.name)
    assert (state.commit_id, state.vtts_ms) == (result.commit_id, result.vtts_ms)
    assert state.control_offsets == {0: result.round_end}
    summary = catalog.load_table("sink.a").current_snapshot().summary
    assert json.loads(summary[f"fanout-sink.{sink.name}.control-offsets"]) == {"0": result.round_end}

    # A round with nothing to commit creates no snapshot.
    before = {t: _snapshots(catalog, t) for t in "abc"}
    assert coordinator.commit_round().tables == {}
    assert {t: _snapshots(catalog, t) for t in "abc"} == before

    # The low watermark went to the coordinator's own group, and CommitToTable/CommitComplete were published.
    holder = Consumer({**sink.kafka, "group.id": channel.coordinator_group(sink.name)})
    watermark = holder.committed([TopicPartition(sink.control_topic, 0)], timeout=30)[0].offset
    holder.close()
    assert coordinator.last_round is not None and watermark == coordinator.last_round.round_end
    reader = channel.ControlReader(sink.channel)
    reader.seek(0)
    kinds = [type(e.event.payload).__name__ for e in reader.read_until(reader.end_offset())]
    reader.close()
    assert kinds.count("CommitToTable") == 3 and kinds.count("CommitComplete") == 2

    # Another batch: only the new rows arrive, once.
    more = _produce(sink, range(60, 90))
    sink.batch()
    coordinator.commit_round()
    for name in "abc":
        assert table_ids(catalog, name) == expected[name] + more[name]
    coordinator.close()


def test_vtts_is_held_back_by_a_partition_that_is_behind_and_unreported(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = _sink(sink_factory, topics=1, partitions=2)
    coordinator = sink.coordinator()
    topic = sink.topic
    produce_json(bootstrap_servers, topic, 0, [{"id": 1, "table": "a"}])
    worker = sink.worker()
    sink.batch(worker)
    assert coordinator.commit_round().vtts_ms is not None  # partition 1 is empty: caught up
    produce_json(bootstrap_servers, topic, 1, [{"id": 2, "table": "a"}])  # behind, never reported
    produce_json(bootstrap_servers, topic, 0, [{"id": 3, "table": "a"}])
    end = end_offset(bootstrap_servers, topic, 0)
    worker.commit_slice(
        Slice(topic, 0, 1, end), read_slice(bootstrap_servers, topic, 0, 1, end), make_processor(catalog)
    )
    result = coordinator.commit_round()
    assert result.tables["sink.a"].outcome == "committed" and result.vtts_ms is None
    assert table_state.read_state(catalog.load_table("sink.a"), sink.name).vtts_ms is None
    assert table_ids(catalog, "a") == [1, 3]
    worker.close()
    coordinator.close()


class _Positions:
    """The partitions each round read (the app's metrics observer sees the same list)."""

    def __init__(self) -> None:
        self.rounds: list[list[PartitionPosition]] = []

    def round_done(self, result: RoundResult, positions: list[PartitionPosition]) -> None:
        self.rounds.append(positions)

    def round_failed(self, error: BaseException) -> None:
        raise AssertionError(error)


def test_a_topic_created_while_running_counts_for_vtts_from_the_next_round(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    """A replicated database gains a table: its new topic matches ``source.pattern``, Spark starts
    reading it, and until its records are delivered VTTS must not claim them committed."""
    prefix = f"db{uuid.uuid4().hex[:8]}"
    first = create_named_topic(bootstrap_servers, f"{prefix}.t0")
    sink = sink_factory(topics={"t0": first}, tables="ab", prefix="s")
    seen = _Positions()
    coordinator = sink.coordinator(source_pattern=re.escape(prefix) + r"\..+", observer=seen)
    produce_json(bootstrap_servers, first, 0, [{"id": 1, "table": "a"}])
    worker = sink.worker()
    sink.batch(worker)
    assert coordinator.commit_round().vtts_ms is not None

    added = create_named_topic(bootstrap_servers, f"{prefix}.t1")
    produce_json(bootstrap_servers, added, 0, [{"id": 2, "table": "b"}])
    behind = coordinator.commit_round()
    assert [(p.topic, p.lag) for p in seen.rounds[-1]] == [(first, 0), (added, 1)]
    assert behind.vtts_ms is None  # the new topic's record is not in any table yet

    end = end_offset(bootstrap_servers, added, 0)
    worker.commit_slice(
        Slice(added, 0, 0, end), read_slice(bootstrap_servers, added, 0, 0, end), make_processor(catalog)
    )
    caught_up = coordinator.commit_round()
    assert caught_up.tables["sink.b"].outcome == "committed" and caught_up.vtts_ms is not None
    assert (table_ids(catalog, "a"), table_ids(catalog, "b")) == ([1], [2])
    worker.close()
    coordinator.close()


def test_catalog_conflict_between_load_and_commit_is_retried_after_a_recheck(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = _sink(sink_factory, topics=1, partitions=1)
    coordinator = sink.coordinator()
    expected = _produce(sink, range(10), tables="a")
    sink.batch()
    conflicts: list[str] = []

    def concurrent_writer(table: str, **_: Any) -> None:
        if not conflicts:  # a real commit by someone else, landing after our load
            conflicts.append(table)
            catalog.load_table(table).append(
                pa.Table.from_pylist([{"id": -1, "topic": "other"}], ARROW_SCHEMA)
            )

    with faults.register("coordinator.before-table-commit", concurrent_writer):
        result = coordinator.commit_round()
    outcome = result.tables["sink.a"]
    assert (outcome.outcome, outcome.attempts) == ("committed", 2)
    assert table_ids(catalog, "a") == [-1, *expected["a"]]
    # The other writer's snapshot sits on top of ours later on: our state is found by walking back.
    catalog.load_table("sink.a").append(pa.Table.from_pylist([{"id": -2, "topic": "other"}], ARROW_SCHEMA))
    assert table_state.read_state(catalog.load_table("sink.a"), sink.name).commit_id == result.commit_id
    coordinator.close()


def test_events_arriving_after_their_round_closed_go_into_the_next_round(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = _sink(sink_factory, topics=1, partitions=1)
    coordinator = sink.coordinator()
    expected = _produce(sink, range(8), tables="ab")
    rounds = []

    def round_while_worker_transaction_is_open(**_: Any) -> None:
        rounds.append(coordinator.commit_round())

    with faults.register("worker.before-commit", round_while_worker_transaction_is_open):
        sink.batch()
    assert rounds[0].tables == {}  # the open transaction holds the round's end before its events
    assert table_ids(catalog, "a") == [] and table_ids(catalog, "b") == []
    later = coordinator.commit_round()
    assert set(later.tables) == {"sink.a", "sink.b"}
    assert table_ids(catalog, "a") == expected["a"] and table_ids(catalog, "b") == expected["b"]
    coordinator.close()


def test_table_dropped_and_recreated_under_the_sink(sink_factory: SinkFactory, catalog: Any) -> None:
    """Files in flight across the recreation (written and announced for the old uuid) are rewritten
    into the new table: their rows were delivered after all, and the new table has the same columns."""
    sink = _sink(sink_factory, topics=1, partitions=1)
    coordinator = sink.coordinator()
    older = _produce(sink, range(6), tables="a")
    sink.batch()  # files written for the old table's uuid
    catalog.drop_table("sink.a")
    catalog.create_table("sink.a", schema=TABLE_SCHEMA)
    result = coordinator.commit_round()
    assert result.tables["sink.a"].outcome == "committed"
    assert result.tables["sink.a"].stale_files == 1
    assert table_ids(catalog, "a") == older["a"]
    newer = _produce(sink, range(100, 104), tables="a")
    sink.batch()
    coordinator.commit_round()
    assert table_ids(catalog, "a") == older["a"] + newer["a"]
    coordinator.close()


def test_two_coordinators_of_one_sink_never_append_twice(sink_factory: SinkFactory, catalog: Any) -> None:
    """I3: the first coordinator loads a table, the second starts (fencing it) and commits everything,
    then the first tries to commit its stale transaction."""
    sink = _sink(sink_factory, topics=1, partitions=2)
    first = sink.coordinator(max_parallel_commits=1)
    expected = _produce(sink, range(20), tables="ab")
    sink.batch()
    second_rounds: list[Any] = []
    started: list[bool] = []

    def second_coordinator_takes_over(table: str, **_: Any) -> None:
        if not started:
            started.append(True)
            second = sink.coordinator()  # init_transactions fences the first
            second_rounds.append(second.commit_round())
            second.close()

    with (
        faults.register("coordinator.before-table-commit", second_coordinator_takes_over),
        pytest.raises(ProducerFencedError),
    ):
        first.commit_round()
    assert {o.outcome for o in second_rounds[0].tables.values()} == {"committed"}
    assert first.last_round is None
    with pytest.raises(ProducerFencedError):
        first.commit_round()  # a fenced coordinator stays down
    for name in "ab":
        assert table_ids(catalog, name) == expected[name]
        assert _snapshots(catalog, name) == 1


def test_event_decoding_ignores_other_sinks_on_a_shared_control_topic(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = _sink(sink_factory, topics=1, partitions=1)
    other = sink_factory(topics=sink.topics, prefix="o", overrides={"control": {"topic": sink.control_topic}})
    coordinator = sink.coordinator()
    expected = _produce(sink, range(5), tables="c")
    other.batch()  # another sink, same control topic and source: its events are not ours
    assert coordinator.commit_round().tables == {}
    sink.batch()
    coordinator.commit_round()
    assert table_ids(catalog, "c") == expected["c"]
    coordinator.close()


def test_coordinator_thread_commits_on_its_interval_and_at_stop(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = _sink(sink_factory, topics=1, partitions=2)
    coordinator = sink.coordinator(commit_interval_s=0.5)
    coordinator.start()
    expected = _produce(sink, range(12), tables="ab")
    sink.batch()
    deadline = time.monotonic() + 30
    while table_ids(catalog, "a") != expected["a"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert table_ids(catalog, "a") == expected["a"]
    more = _produce(sink, range(12, 20), tables="ab")
    sink.batch()
    coordinator.stop(commit_now=True)
    coordinator.close()
    for name in "ab":
        assert table_ids(catalog, name) == expected[name] + more[name]


def test_the_thread_commits_a_batch_as_soon_as_every_planned_range_reported(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """With a commit interval far beyond the test, only the batch's completion can start the round."""
    sink = _sink(sink_factory, topics=1, partitions=2)
    rounds = RoundTrigger(3600.0)
    coordinator = sink.coordinator(commit_interval_s=3600.0, rounds=rounds)
    coordinator.start()
    expected = _produce(sink, range(12), tables="ab")
    ranges = {(sink.topic, p): (0, end_offset(sink.bootstrap, sink.topic, p)) for p in range(2)}
    rounds.expect(0, ranges)  # what the driver does before its tasks run
    worker = sink.worker()
    run_planned_batch(worker, sink.bootstrap, ranges, make_processor(catalog))
    worker.close()
    deadline = time.monotonic() + 60
    while coordinator.last_round is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert coordinator.last_round is not None, "no round ran after the batch's ranges all reported"
    assert coordinator.last_round.reason == round_trigger.BATCH_COMPLETE
    for name in "ab":
        assert table_ids(catalog, name) == expected[name]
    assert rounds.pending_batches() == [], "the round held the batch"
    coordinator.stop(commit_now=False)
    coordinator.close()


def test_a_stop_waits_for_the_reports_of_a_batch_the_driver_finished_before_its_final_round(
    sink_factory: SinkFactory, catalog: Any
) -> None:
    """A transaction's markers may be written just after its commit returned, so the driver can see
    its batch finish before the coordinator can read the batch's reports. The last round of a stop
    (the end of an available-now run) must wait for them, or the run ends with tables behind what it
    delivered (seen in CI on a loaded machine: a change table one batch behind). Here the reports
    arrive 2 s after the stop is asked."""
    import threading

    sink = _sink(sink_factory, topics=1, partitions=2)
    rounds = RoundTrigger(3600.0)
    coordinator = sink.coordinator(commit_interval_s=3600.0, rounds=rounds)
    coordinator.start()
    expected = _produce(sink, range(12), tables="ab")
    ranges = {(sink.topic, p): (0, end_offset(sink.bootstrap, sink.topic, p)) for p in range(2)}
    rounds.expect(0, ranges)
    rounds.finished(0)  # the driver's word, ahead of the readable reports

    def late_batch() -> None:
        time.sleep(2.0)
        worker = sink.worker()
        run_planned_batch(worker, sink.bootstrap, ranges, make_processor(catalog))
        worker.close()

    writer = threading.Thread(target=late_batch)
    writer.start()
    try:
        result = coordinator.stop(commit_now=True)
    finally:
        writer.join()
        coordinator.close()
    assert result is not None and result.reason == round_trigger.STOP
    for name in "ab":
        assert table_ids(catalog, name) == expected[name]


def test_many_files_travel_in_several_events_and_land_in_one_snapshot(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    sink = _sink(sink_factory, topics=1, partitions=1)
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="id"))
    catalog.create_table("sink.p", schema=TABLE_SCHEMA, partition_spec=spec)  # one file per id
    topic = sink.topic
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "p"} for i in range(10)])
    worker = sink.worker(max_files_per_event=3)
    sink.batch(worker)
    worker.close()
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    assert result.tables["sink.p"].files == 10
    assert table_ids(catalog, "p") == list(range(10))
    assert len(catalog.load_table("sink.p").snapshots()) == 1
    reader = channel.ControlReader(sink.channel)
    reader.seek(0)
    kinds = [type(e.event.payload).__name__ for e in reader.read_until(reader.end_offset())]
    reader.close()
    assert kinds.count("DataWritten") == 4


def test_the_coordinators_settings_are_the_configs_source_and_control_sections_in_seconds() -> None:
    control = {"commit-interval": "10s", "commit-timeout": "45s", "offsets-refresh-interval": "6h"}
    listed = {"name": "shop", "source": {"topics": ["orders", "refunds"]}, "control": control}
    assert CoordinatorSettings.of(
        parse_config({**listed, "tables": {"a.orders": {}}})
    ) == CoordinatorSettings(
        source_topics=("orders", "refunds"),
        commit_interval_s=10.0,
        commit_timeout_s=45.0,
        offsets_refresh_interval_s=6 * 3600.0,
    )
    matched = {"name": "shop", "source": {"pattern": "eu[.].*"}, "tables": {"a.orders": {}}}
    assert CoordinatorSettings.of(parse_config(matched)) == CoordinatorSettings(source_pattern="eu[.].*")
