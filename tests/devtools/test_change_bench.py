"""The change benchmark's own logic on small sizes, without a broker or Spark: the generated stream
is what Debezium would capture and its model is the stream replayed; the sink's processor reads the
envelopes into the model's rows; the key-by-key check counts every kind of mismatch; the report
gives no verdict on a system whose table differs from the model."""

from __future__ import annotations

import copy
import json
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from bench import change_report, changes, merge_peer, ours
from bench.change_state import (
    ReadCost,
    Replica,
    StateCheck,
    TableFiles,
    check_state,
    examine,
)
from bench.change_stream import (
    KEY,
    TABLE,
    ChangePlan,
    ChangeStream,
    create_table,
    generate,
)
from bench.proctree import ChildRun
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.transform.processor import build_processor

PLAN = ChangePlan(keys=3000, events=6000, seed=5)


@pytest.fixture(scope="module")
def stream() -> ChangeStream:
    return generate(PLAN)


def _replay(stream: ChangeStream) -> dict[int, dict[str, Any]]:
    """The stream applied one event at a time in Python, asserting each envelope is consistent with
    the state before it (what a source database's change log guarantees)."""
    state = {row[KEY]: row for row in stream.initial.to_pylist()}
    for key, value in zip(stream.keys.to_pylist(), stream.values.to_pylist(), strict=True):
        event, key_id = json.loads(value), json.loads(key)[KEY]
        before, after = event["before"], event["after"]
        assert event["source"]["table"] == "customers"
        if event["op"] == "c":
            assert key_id not in state and before is None and after[KEY] == key_id
        else:
            assert key_id in state and before[KEY] == key_id
            was = state[key_id]
            assert (before["name"], before["points"], Decimal(before["amount"])) == (
                was["name"],
                was["points"],
                was["amount"],
            )
        if event["op"] == "d":
            assert after is None
            del state[key_id]
        else:
            after["amount"] = Decimal(after["amount"])
            state[key_id] = after
    return state


def test_the_stream_is_a_consistent_change_log_and_the_model_is_its_replay(stream: ChangeStream) -> None:
    state = _replay(stream)
    model = {row[KEY]: row for row in stream.final.to_pylist()}
    assert model.keys() == state.keys()
    for key_id, row in state.items():
        assert (model[key_id]["name"], model[key_id]["points"], model[key_id]["amount"]) == (
            row["name"],
            row["points"],
            row["amount"],
        )
    assert stream.final[KEY].to_pylist() == sorted(model)
    assert sum(stream.ops.values()) == PLAN.events
    ops = Counter(json.loads(v)["op"] for v in stream.values.to_pylist())
    assert dict(ops) == stream.ops
    # Drawn 70/20/10; draws on deleted keys are drawn again, so the shares stay near the plan's.
    assert 0.67 < ops["u"] / PLAN.events < 0.73 and 0.17 < ops["c"] / PLAN.events < 0.23
    assert 0.085 < ops["d"] / PLAN.events < 0.115


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_bytes(stream: ChangeStream) -> None:
    assert generate(PLAN).values.equals(stream.values)
    assert not generate(ChangePlan(keys=3000, events=6000, seed=6)).values.equals(stream.values)


def test_the_sinks_processor_reads_the_envelopes_into_the_models_rows(
    stream: ChangeStream, catalog_settings: CatalogSettings, catalog: Any, tmp_path: Path
) -> None:
    """The sink's own decode of the stream, last change per key in one slice, applied to the initial
    rows gives the model: the benchmark's envelopes and types are ones the sink reads as meant."""
    create_table(catalog, stream.initial)
    run = changes.SystemInput("127.0.0.1:1", "t", tmp_path, catalog_settings, 1, 1.0, 1000)
    process = build_processor(parse_config(changes.sink_config(run, "cdc-bench"), "sink.yaml"), catalog)
    values = stream.values.cast(pa.binary()).to_pylist()
    routed = process(make_raw_slice(values, topic="t"))
    assert process.last_stats.reconciles(), process.last_stats
    changed = routed.tables[TABLE]
    assert changed.deleted_keys is not None
    touched = pa.concat_arrays(
        [changed.rows[KEY].combine_chunks(), changed.deleted_keys[KEY].combine_chunks()]
    )
    table = catalog.load_table(TABLE).scan().to_arrow()
    kept = table.filter(pc.invert(pc.is_in(table[KEY], touched)))
    result = pa.concat_tables([kept, changed.rows.select(kept.column_names).cast(kept.schema)])
    check = check_state(result, stream.final)
    assert check.mismatches == 0, check.examples


def test_the_key_by_key_check_counts_every_kind_of_mismatch(stream: ChangeStream) -> None:
    model = stream.final
    assert check_state(model, model).mismatches == 0
    rows = model.to_pylist()
    gone, doubled, changed = rows[0], rows[1], copy.deepcopy(rows[2])
    changed["amount"] += Decimal("0.01")
    stranger = {**rows[3], KEY: 10**9}
    landed = pa.Table.from_pylist([*rows[3:], doubled, doubled, changed, stranger], schema=model.schema)
    check = check_state(landed, model)
    assert (check.missing, check.extra, check.duplicated, check.differing) == (1, 1, 1, 1)
    assert check.mismatches == 4
    text = "\n".join(check.examples)
    assert f"id {gone[KEY]}: missing" in text and f"id {10**9}: not in the model" in text
    assert f"id {changed[KEY]}: amount" in text


EVENTS = 20


def _system(name: str, wall_s: list[float], mismatches: int = 0, earlier: int = 0) -> dict[str, Any]:
    """A system's JSON as the benchmark writes it: rounds of ``wall_s`` (half of it start-up),
    ``mismatches`` missing keys in its last table, ``earlier`` in its first round's."""

    def check(missing: int) -> StateCheck:
        return StateCheck(10 - missing, 10, missing, 0, 0, 0, ["id 7: missing"] if missing else [])

    def cost(delete_files: int, scan_s: float, spark_rows: int = 10) -> ReadCost:
        return ReadCost(TableFiles(3, delete_files, 20 * delete_files, 4), scan_s, 0.5, spark_rows)

    rounds = [change_report.Round(ChildRun(w, 2.0, 900.0, 0.0, 0, ""), w / 2) for w in wall_s]
    replica = Replica(check(mismatches), cost(2, 0.2), 3.0, cost(0, 0.15), check(mismatches))
    earlier_checks = [check(earlier)] + [check(0)] * (len(wall_s) - 2)
    return change_report.SystemResult(name, rounds, replica, earlier_checks).to_json(EVENTS)


def _data(systems: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "command": "PYTHONPATH=tests python -m bench.changes --keys 10",
        "plan": {"keys": 10, "events": EVENTS, "updates": 0.7, "inserts": 0.2, "deletes": 0.1, "seed": 1},
        "ops": {"u": 14, "c": 4, "d": 2},
        "produce_s": 0.1,
        "repeat": 3,
        "rounds": 3,
        "systems": systems,
    }


PEER = "Spark foreachBatch + MERGE INTO"


def test_the_report_gives_verdicts_only_on_tables_that_match_the_model() -> None:
    peer = _system(PEER, [0.02, 0.01, 0.04])
    good = change_report.markdown(_data([peer, _system(change_report.OURS, [0.008] * 3)]))
    assert "| change events/s >= 2x Spark foreachBatch + MERGE INTO | 2.50x | met |" in good
    assert f"| {PEER} | 1,000 (500-2,000) | 2,000 | 100,000.0 | 900 | 4 | 3 / 2 (40) | 3 / 0 (0) |" in good
    assert "| the same after start-up (launch to first batch left out) | 2.50x | met |" in good
    assert "| PyIceberg full scan before maintenance <= 2x after | 0.200 s vs 0.150 s (1.33x) | met |" in good
    not_measured = "| change events/s >= 2x the peer |  | not measured |"
    last_bad = change_report.markdown(_data([peer, _system(change_report.OURS, [0.008] * 3, mismatches=3)]))
    assert not_measured in last_bad
    assert "**3** (3 missing)" in last_bad and "  - id 7: missing" in last_bad
    earlier_bad = change_report.markdown(_data([peer, _system(change_report.OURS, [0.008] * 3, earlier=2)]))
    assert not_measured in earlier_bad and "round 1 after the stream: mismatches **2**" in earlier_bad
    miscounted = _system(change_report.OURS, [0.008] * 3)
    miscounted["after"]["spark_rows"] = 11
    odd = change_report.markdown(_data([peer, miscounted]))
    assert not_measured in odd and "**11** counted by Spark SQL" in odd


SPARK_PLAN = ChangePlan(keys=400, events=800, seed=5)
"""The Spark test's stream: Spark's cost is per job, not per row, so a tenth of :data:`PLAN` still
gives every batch updates, inserts and deletes of keys the earlier batches merged."""


@pytest.mark.bench
def test_the_merge_peer_and_maintenance_keep_the_model_key_by_key(
    spark: Any, spark_catalog: str, catalog: Any
) -> None:
    """The peer's micro-batch (parse, last change per key by offset, MERGE) over the stream in three
    batches, then the benchmark's measurement and maintenance: Spark's position deletes fold away
    and every key still matches the model."""
    stream = generate(SPARK_PLAN)
    create_table(catalog, stream.initial)
    values = stream.values.cast(pa.binary()).to_pylist()
    third = len(values) // 3 + 1
    for start in range(0, len(values), third):
        rows = [(value, start + n) for n, value in enumerate(values[start : start + third])]
        batch = spark.createDataFrame(rows, "value binary, offset long")
        merge_peer.merge_batch(batch, f"{spark_catalog}.{TABLE}")
    replica = examine(catalog, spark, spark_catalog, stream.final, repeat=1)
    assert replica.check.mismatches == 0, replica.check.examples
    assert replica.before.files.delete_files > 0 and replica.before.spark_rows == len(stream.final)
    assert replica.after.files.delete_files == 0 and replica.after.files.data_files == 1
    assert replica.after_check.mismatches == 0, replica.after_check.examples


def test_start_up_ends_where_each_systems_log_shows_its_first_batch() -> None:
    app_log = (
        "2026-11-25 21:23:50,000 INFO fanout_sink.app: batch 0: 0 records in, 0 already delivered, 0 "
        "dead-lettered, 0 filtered, rows {}, files {} (0.1s, 0 slices, peak worker RSS 0 MB), 0 records/s\n"
        "2026-11-25 21:23:55,367 INFO fanout_sink.app: batch 1: 3999 records in, 0 already delivered, 0 "
        'dead-lettered, 0 filtered, rows {"crm.customers": 3358}, files {"crm.customers": 2} '
        "(4.9s, 2 slices, peak worker RSS 302 MB), 815 records/s\n"
    )
    expected = datetime(2026, 11, 25, 21, 23, 55, 367000).timestamp() - 4.9
    assert ours.first_batch_started(app_log) == pytest.approx(expected)
    assert (
        merge_peer.first_batch_started(f"noise\n{merge_peer.FIRST_BATCH_LINE}1767225600.250\n")
        == 1767225600.25
    )
    assert merge_peer.first_batch_started("no batch yet\n") is None
