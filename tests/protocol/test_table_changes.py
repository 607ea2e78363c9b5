"""Tables changed by others between the sink's writes and commits: snapshot expiry, spec changes,
drop and recreate. Real broker, real SQLite catalog, real Iceberg metadata changes; only the crash
points are simulated (fault-point callbacks that raise)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from support.common import (
    ARROW_SCHEMA,
    NAMESPACE,
    create_tables,
    make_processor,
    produce_json,
    run_batch,
    table_ids,
)

from fanout_sink import faults
from fanout_sink.protocol import table_state
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker

pytestmark = pytest.mark.kafka


class _Crash(Exception):
    """Stands in for the coordinator process dying at a fault point."""


def _crash(**_: Any) -> None:
    raise _Crash("simulated coordinator death")


def _new_sink(make_topic: Callable[..., str]) -> tuple[str, str, str]:
    name = f"s{uuid.uuid4().hex[:6]}"
    return name, make_topic("src", partitions=1), f"{name}-control"


def _coordinator(name: str, conf: dict[str, Any], control: str, catalog: Any, topic: str) -> Coordinator:
    coordinator = Coordinator(name, conf, control, catalog, source_topics=[topic])
    coordinator.open()
    return coordinator


def test_floor_survives_expiry_of_the_sinks_snapshots(
    bootstrap_servers: str, make_topic: Callable[..., str], catalog: Any
) -> None:
    """Scenario 5. Real: broker, catalog, another writer's append, ``expire_snapshots`` of PyIceberg.
    Simulated: the coordinator dies after its table commit and before it moves its low watermark
    (a raising fault-point callback), so the next coordinator re-reads the same control events."""
    conf = {"bootstrap.servers": bootstrap_servers}
    name, topic, control = _new_sink(make_topic)
    create_tables(catalog, ["a"])
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(5)])
    worker = SliceWorker(name, conf, control)
    run_batch(worker, bootstrap_servers, {topic: 1}, make_processor(catalog))
    worker.close()

    first = _coordinator(name, conf, control, catalog, topic)
    with faults.register("coordinator.before-complete", _crash), pytest.raises(_Crash):
        first.commit_round()  # table committed, low watermark still 0
    first.close()
    assert table_ids(catalog, "a") == list(range(5))

    table = catalog.load_table(f"{NAMESPACE}.a")
    table.append(pa.Table.from_pylist([{"id": -1, "topic": "other"}], ARROW_SCHEMA))  # another writer
    table = catalog.load_table(f"{NAMESPACE}.a")
    table.maintenance.expire_snapshots().older_than(dt.datetime.now(dt.timezone.utc)).commit()
    table = catalog.load_table(f"{NAMESPACE}.a")
    assert len(table.snapshots()) == 1, "only the other writer's snapshot is left"

    second = _coordinator(name, conf, control, catalog, topic)  # re-reads from control offset 0
    result = second.commit_round()
    second.close()
    assert result.tables[f"{NAMESPACE}.a"].outcome == "already-committed"
    assert table_ids(catalog, "a") == [-1, *range(5)]
    assert table_state.read_state(catalog.load_table(f"{NAMESPACE}.a"), name).next_control_offset() > 0
