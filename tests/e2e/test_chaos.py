"""The chaos runner: its verdict must catch what it claims to catch, and a short run must pass."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from fanout_sink.devtools.chaos import kills
from fanout_sink.devtools.chaos.runner import ChaosOptions, ChaosRun
from fanout_sink.devtools.chaos.traffic import record
from fanout_sink.devtools.chaos.verify import verify
from fanout_sink.protocol import table_state

ID_SCHEMA = pa.schema([pa.field("id", pa.string())])


def _append(
    catalog: Any, name: str, ids: list[str], control_offset: int | None = None, sink: str = "s"
) -> None:
    namespace = name.split(".")[0]
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table_if_not_exists(name, ID_SCHEMA)
    properties = {}
    if control_offset is not None:
        properties = table_state.summary_properties("s", {0: control_offset}, "c", None)
    table.append(pa.table({"id": ids}, schema=ID_SCHEMA), snapshot_properties=properties)


@pytest.mark.kafka
def test_the_verdict_counts_duplicates_losses_stray_dead_letters_lag_and_offsets_going_back(
    bootstrap_servers: str, make_topic: Callable[..., str], catalog: Any
) -> None:
    source, dlq = make_topic("chaos-src"), make_topic("chaos-dlq")
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    values = {
        "o1": b'{"id": "o1", "type": "order", "region": "eu"}',
        "c1": b'{"id": "c1", "type": "click", "region": "us"}',
        "n1": b'{"id": "n1", "type": "noise"}',
        "b1": b'{"id": "b1", "type": "order", "amo',
    }
    for rid, value in values.items():
        producer.produce(source, value=value, key=rid.encode())
    producer.produce(  # a dead letter for the good record o1 at offset 0, not for b1 at offset 3
        dlq,
        value=values["o1"],
        headers=[
            ("fanout-sink.source.topic", source.encode()),
            ("fanout-sink.source.partition", b"0"),
            ("fanout-sink.source.offset", b"0"),
        ],
    )
    producer.flush(30)
    _append(catalog, "chaos.orders", ["o1"], control_offset=5)
    _append(catalog, "chaos.orders", [], control_offset=3)  # the control offsets go back
    _append(catalog, "chaos.money", ["o1", "o1"])  # a duplicate
    _append(catalog, "region.eu", ["o1"])
    _append(catalog, "region.us", ["c1"])  # chaos.clicks is missing: c1 is lost there

    verdict = verify(bootstrap_servers, [source], dlq, "s", catalog)

    assert (verdict.records, verdict.duplicates, verdict.losses, verdict.filtered) == (4, 1, 1, 1)
    problems = "\n".join(verdict.problems)
    assert "chaos.money: 1 duplicate and 0 lost rows" in problems
    assert "chaos.clicks: missing, 1 rows expected" in problems
    assert "chaos.orders: control offsets went back from {0: 5} to {0: 3}" in problems
    assert "dead letters: 1 bad records missing, 1 unexpected or repeated" in problems
    assert f"sink group at None for {source}[0], the topic ends at 4" in problems
    assert not verdict.ok


def test_records_are_reproducible_from_the_seed() -> None:
    import random

    first = [record(i, random.Random(7), "r") for i in range(3)]
    assert first == [record(i, random.Random(7), "r") for i in range(3)]
    assert len({rid for rid, _ in first}) == 3


@pytest.mark.chaos
@pytest.mark.timeout(1500)
@pytest.mark.spark
@pytest.mark.kafka
def test_short_chaos_run_breaks_each_thing_once_and_loses_nothing(tmp_path: Path) -> None:
    """The CI configuration: one cycle per kind of breakage, then every table counted row by row."""
    result = ChaosRun(ChaosOptions(cycles=len(kills.KINDS), records=8000, seed=11, work_dir=tmp_path)).run()
    print(result.line())
    assert result.verdict.ok, "\n".join(result.verdict.problems)
    assert dict(result.kills) == dict.fromkeys(kills.KINDS, 1), f"every kind landed once: {result.line()}"
    assert (result.verdict.duplicates, result.verdict.losses) == (0, 0)
    assert result.verdict.records == 8000 and result.verdict.dead_lettered > 0 and result.verdict.filtered > 0
