"""A real coordinator records what a consistent read needs, across a failed table commit.

Real: broker, worker transactions, the coordinator's rounds and table commits, the catalog. Simulated:
table b's commit fails through a fault-point callback, as a catalog refusing it would. The reading
rules themselves are ``tests/test_consistent_read.py``.
"""

from __future__ import annotations

from typing import Any

from support.common import NAMESPACE, produce_json, table_ids
from support.sink_factory import SinkFactory

from fanout_sink import consistent_read, faults


class _Refused(Exception):
    pass


def _ids(catalog: Any, point: consistent_read.ConsistentPoint, name: str) -> list[int]:
    table = catalog.load_table(f"{NAMESPACE}.{name}")
    return sorted(point.scan(table).to_arrow()["id"].to_pylist())


def test_a_partial_round_is_never_read_and_the_next_whole_round_is(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any
) -> None:
    sink = sink_factory(partitions={"src": 1}, tables="abc", prefix="k")
    worker, coordinator = sink.worker(), sink.coordinator()

    def batch(*rows: tuple[int, str]) -> None:
        produce_json(bootstrap_servers, sink.topic, 0, [{"id": i, "table": t} for i, t in rows])
        sink.batch(worker)

    def fail_b(table: str, **_: Any) -> None:
        if table == f"{NAMESPACE}.b":
            raise _Refused("catalog refuses table b")

    try:
        batch((1, "a"), (1, "b"))
        first = coordinator.commit_round()
        batch((2, "a"), (2, "b"))
        with faults.register("coordinator.before-table-commit", fail_b):
            partial = coordinator.commit_round()
        assert partial.tables[f"{NAMESPACE}.b"].outcome == "failed"
        assert table_ids(catalog, "a") == [1, 2], "a is a round ahead of b"
        point = consistent_read.latest_point(catalog, sink.name)
        assert point.commit_id == first.commit_id
        assert (_ids(catalog, point, "a"), _ids(catalog, point, "b")) == ([1], [1])

        batch((3, "c"))  # a has no files in this round, b's wait from the partial one
        whole = coordinator.commit_round()
        assert set(whole.tables) == {f"{NAMESPACE}.b", f"{NAMESPACE}.c"}
        point = consistent_read.latest_point(catalog, sink.name)
        assert (point.commit_id, point.control_offset) == (whole.commit_id, whole.round_end)
        assert [_ids(catalog, point, t) for t in "abc"] == [[1, 2], [1, 2], [3]]
    finally:
        worker.close()
        coordinator.close()
