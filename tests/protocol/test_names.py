"""Names derived from the sink name are injective (issue 11, scenario 9).

Real: the broker, two sinks' workers committing transactions side by side, the catalog. Nothing
is simulated; the colliding pair is exactly the one a '-'-joined name could not tell apart.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import example, given
from hypothesis import strategies as st
from support.common import produce_json
from support.sink_factory import SinkFactory, field_routes

from fanout_sink import faults
from fanout_sink.protocol import channel, legacy_names, recovery
from fanout_sink.protocol.slices import SliceResult

SINK_NAMES = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,12}\Z")
TOPIC_NAMES = st.from_regex(r"\A[A-Za-z0-9._-]{1,12}\Z")


@given(st.lists(st.tuples(SINK_NAMES, TOPIC_NAMES, st.integers(0, 20)), min_size=2, max_size=6, unique=True))
@example([("a", "b-c", 0), ("a-b", "c", 0)])
@example([("a", "b", 1), ("a-b", "1", 1)])
def test_distinct_sink_topic_partition_give_distinct_transactional_ids(
    keys: list[tuple[str, str, int]],
) -> None:
    worker_ids = {channel.worker_transactional_id(*key) for key in keys}
    coordinator_ids = {channel.coordinator_transactional_id(sink) for sink, _, _ in keys}
    assert len(worker_ids) == len(keys)
    assert not worker_ids & coordinator_ids


@given(st.lists(SINK_NAMES, min_size=2, max_size=6, unique=True))
@example(["x", "x-coordinator"])
def test_group_names_of_distinct_sinks_never_meet(sinks: list[str]) -> None:
    groups = [channel.sink_group(s) for s in sinks] + [channel.coordinator_group(s) for s in sinks]
    assert len(set(groups)) == len(groups)
    assert all(g.startswith("fanout-sink") for g in groups)


def test_sink_x_coordinator_and_sink_x_use_different_groups() -> None:
    assert channel.sink_group("x-coordinator") != channel.coordinator_group("x")


def test_sinks_whose_dashed_names_collide_do_not_fence_each_other(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """Sink ``P`` reads topic ``b-R`` and sink ``P-b`` reads topic ``R``: with '-' joins both workers
    used the transactional id ``fanout-sink-P-b-R-0``, so the second fenced the first mid-slice."""
    tag = uuid.uuid4().hex[:8]
    first_topic, second_topic = f"b-r{tag}", f"r{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (first_topic, second_topic)]).values():
        future.result(timeout=30)
    first = sink_factory(name=f"n{tag}", topics={"src": first_topic}, tables="ab")
    second = sink_factory(name=f"n{tag}-b", topics={"src": second_topic}, overrides=field_routes("ab"))
    for sink in (first, second):
        produce_json(bootstrap_servers, sink.topic, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(4)])
    first_worker, second_worker = first.worker(), second.worker()
    second_results: list[SliceResult] = []

    def second_sink_commits(
        topic: str, **_: object
    ) -> None:  # the first sink is about to open its transaction
        if topic != first.topic:
            return
        second_results.append(second.deliver(second_worker, 4))

    with faults.register("worker.after-write-files", second_sink_commits):
        first_result = first.deliver(first_worker, 4)
    assert first_result.transaction_committed and second_results[0].transaction_committed
    assert first.committed(first.topic, 0) == 4
    assert second.committed(second.topic, 0) == 4
    first_worker.close()
    second_worker.close()


def test_coordinator_resumes_from_the_legacy_named_group_when_the_new_one_is_empty(
    bootstrap_servers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An existing deployment's coordinator group has the '-' name; the first start after the rename
    reads its low watermark (a real commit to the legacy group on the real broker)."""
    sink = f"m{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": bootstrap_servers}
    control = f"{sink}-control"
    channel.ensure_control_topic(channel.SinkChannel(sink, conf, control))
    produce_json(bootstrap_servers, control, 0, [{"noise": i} for i in range(8)])  # other sinks' traffic
    legacy = Consumer({**conf, "group.id": legacy_names.legacy_coordinator_group(sink)})
    legacy.commit(offsets=[TopicPartition(control, 0, 7)], asynchronous=False)
    legacy.close()
    reader = channel.ControlReader(channel.SinkChannel(sink, conf, control))
    try:
        with caplog.at_level(logging.INFO):
            assert recovery.seek_to_low_watermark(reader) == 7
    finally:
        reader.close()
    assert "migrated" in caplog.text
