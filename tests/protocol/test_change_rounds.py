"""Change tables (``changes:``) through the real broker, catalog and processor: each key ends in the
state of its last change, rounds and kills notwithstanding (invariant I7).

Records carry ``table``, ``id``, ``v`` and ``op`` (``u`` upsert, ``d`` delete); a key's changes
all go to one partition, as Debezium and any keyed producer send them. The model replays the same
changes in offset order; every check compares a whole table with it, key by key.
"""

from __future__ import annotations

import json
import random
import signal
from typing import Any

from support.common import produce_json
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink import faults
from fanout_sink.protocol import table_state
from fanout_sink.transform.processor import build_processor

Model = dict[str, dict[int, int]]
"""Per table letter, key -> value of the key's live row."""


def _route(table: str) -> dict[str, Any]:
    return {
        "when": f"table == '{table}'",
        "select": "{id: id, v: v}",
        "changes": {"format": "upsert", "key": ["id"], "delete-when": "op == 'd'"},
    }


def _sink(sink_factory: SinkFactory, partitions: int = 2) -> SinkUnderTest:
    return sink_factory(
        partitions={"src": partitions},
        prefix="chg",
        overrides={"tables": {f"sink.{t}": _route(t) for t in "ab"}},
    )


def _produce(sink: SinkUnderTest, model: Model, changes: list[tuple[str, int, int | None]]) -> None:
    """Produce ``(table, key, value or None for a delete)`` in this order, key k to partition k % n,
    and apply them to the model."""
    partitions = sink.partitions[sink.topic]
    per_partition: dict[int, list[dict[str, Any]]] = {p: [] for p in range(partitions)}
    for table, key, value in changes:
        op = "d" if value is None else "u"
        per_partition[key % partitions].append({"table": table, "id": key, "v": value, "op": op})
        if value is None:
            model[table].pop(key, None)
        else:
            model[table][key] = value
    for partition, values in per_partition.items():
        if values:
            produce_json(sink.bootstrap, sink.topic, partition, values)


def _state(sink: SinkUnderTest, table: str) -> dict[int, int]:
    """The table's rows as key -> value; a key twice fails (a change must never leave two rows)."""
    rows = sink.catalog.load_table(f"sink.{table}").scan().to_arrow().to_pylist()
    keys = [r["id"] for r in rows]
    assert len(keys) == len(set(keys)), (
        f"sink.{table}: duplicate keys {sorted(k for k in keys if keys.count(k) > 1)}"
    )
    return {r["id"]: r["v"] for r in rows}


def _assert_model(sink: SinkUnderTest, model: Model) -> None:
    for table, expected in model.items():
        assert _state(sink, table) == expected, f"sink.{table} differs from the model"


def _random_changes(
    rng: random.Random, model: Model, count: int, keys: int
) -> list[tuple[str, int, int | None]]:
    changes: list[tuple[str, int, int | None]] = []
    for _ in range(count):
        table = rng.choice("ab")
        key = rng.randrange(keys)
        changes.append((table, key, None if rng.random() < 0.25 else rng.randrange(1_000_000)))
    return changes


def test_each_key_ends_in_its_last_change_across_slices_batches_and_rounds(sink_factory: SinkFactory) -> None:
    sink = _sink(sink_factory)
    process = build_processor(sink.config, sink.catalog)
    coordinator = sink.coordinator()
    model: Model = {"a": {}, "b": {}}

    _produce(sink, model, [(t, k, k) for t in "ab" for k in range(20)])
    sink.batch(process=process)
    first = coordinator.commit_round()
    assert {t: (o.outcome, o.inserted, o.updated, o.deleted) for t, o in first.tables.items()} == {
        "sink.a": ("committed", 20, 0, 0),
        "sink.b": ("committed", 20, 0, 0),
    }
    _assert_model(sink, model)

    # Updates, deletes, a delete of an absent key, an update of an absent key, and one key changed
    # in two batches of the same round (the later batch wins; the earlier row is deleted in the
    # same snapshot).
    _produce(sink, model, [("a", 1, 100), ("a", 2, None), ("a", 99, None), ("a", 50, 5000), ("a", 3, 30)])
    sink.batch(process=process)
    _produce(sink, model, [("a", 3, 31), ("a", 1, None), ("a", 2, 200)])
    sink.batch(process=process)
    second = coordinator.commit_round()
    a = second.tables["sink.a"]
    # Live before the round: 0..19. Keys 1, 2, 3 changed (1 deleted at last, 2 back, 3 updated twice),
    # 50 inserted, 99 never existed.
    assert (a.outcome, a.inserted, a.updated, a.deleted) == ("committed", 1, 2, 1)
    assert "sink.b" not in second.tables
    _assert_model(sink, model)
    summary = sink.catalog.load_table("sink.a").current_snapshot().summary
    assert summary[f"fanout-sink.{sink.name}.updated-rows"] == "2"
    assert int(summary["added-position-deletes"]) >= 3
    assert table_state.read_state(sink.catalog.load_table("sink.a"), sink.name).commit_id == second.commit_id

    rng = random.Random(23)
    for _ in range(3):
        _produce(sink, model, _random_changes(rng, model, 120, keys=40))
        sink.batch(process=process)
        if rng.random() < 0.5:
            coordinator.commit_round()
    coordinator.commit_round()
    _assert_model(sink, model)
    coordinator.close()


def test_coordinator_killed_after_resolving_and_between_two_change_tables(sink_factory: SinkFactory) -> None:
    """Killed after the position deletes are written but before the commit: nothing is visible and
    the restart resolves again. Killed between table a's and b's commits: a is not changed twice."""
    sink = _sink(sink_factory)
    process = build_processor(sink.config, sink.catalog)
    model: Model = {"a": {}, "b": {}}
    _produce(sink, model, [(t, k, k) for t in "ab" for k in range(30)])
    sink.batch(process=process)
    assert json.loads(sink.run_child("coordinator")) == {"sink.a": "committed", "sink.b": "committed"}

    _produce(sink, model, [(t, k, None if k % 3 == 0 else k * 10) for t in "ab" for k in range(0, 40, 2)])
    sink.batch(process=process)
    sink.run_child("coordinator", "coordinator.after-resolve=kill", expect=-signal.SIGKILL)
    assert _state(sink, "a") == {k: k for k in range(30)}  # the round's changes are not visible
    sink.run_child("coordinator", "coordinator.after-table-commit=kill", expect=-signal.SIGKILL)
    assert _state(sink, "a") == model["a"]
    assert json.loads(sink.run_child("coordinator")) == {"sink.a": "already-committed", "sink.b": "committed"}
    _assert_model(sink, model)
    assert len(sink.catalog.load_table("sink.a").snapshots()) == 2


def test_a_compaction_between_resolution_and_commit_makes_the_round_resolve_again(
    sink_factory: SinkFactory,
) -> None:
    """A rewrite of every data file lands after the deletes were resolved against the old files: the
    commit conflicts, the retry resolves against the rewritten files, and no deleted or replaced row
    comes back."""
    sink = _sink(sink_factory, partitions=1)
    process = build_processor(sink.config, sink.catalog)
    coordinator = sink.coordinator()
    model: Model = {"a": {}}
    _produce(sink, model, [("a", k, k) for k in range(10)])
    sink.batch(process=process)
    sink.batch(process=process)
    coordinator.commit_round()
    _produce(sink, model, [("a", k, k) for k in range(10, 20)])
    sink.batch(process=process)
    coordinator.commit_round()  # two data files now
    before = len(sink.catalog.load_table("sink.a").inspect.data_files())

    _produce(sink, model, [("a", 3, None), ("a", 12, 1200), ("a", 25, 2500)])
    sink.batch(process=process)
    compacted: list[int] = []

    def compact(table: str, **_: object) -> None:
        if compacted or table != "sink.a":
            return
        live = sink.catalog.load_table("sink.a")
        live.overwrite(live.scan().to_arrow())  # every row rewritten into a new file, same content
        compacted.append(len(live.inspect.data_files()))

    with faults.register("coordinator.after-resolve", compact):
        result = coordinator.commit_round()
    assert compacted == [1] and before == 2, "the rewrite replaced both files by one"
    outcome = result.tables["sink.a"]
    assert (outcome.outcome, outcome.attempts) == ("committed", 2)
    assert (outcome.inserted, outcome.updated, outcome.deleted) == (1, 1, 1)
    _assert_model(sink, model)
    coordinator.close()
