"""Where delivery resumes when the sink group has no offset (issue 11, scenarios 3 and 4).

Real: the broker (a private one with the chaos run's retention, ``kills.BROKER_PROPERTIES``:
``offsets.retention.minutes`` is 1 and the retention check runs every 5 s, so the sink group's
offsets really expire), workers' transactions, the control topic's DataComplete events,
AdminClient.delete_records, a running coordinator thread. Simulated: Spark's checkpoint, written file
by file the way Spark 4 writes it (``support.common.write_checkpoint_batch``), and the restart, which
is the start-up planning (``planning.plan_start``) the app runs before Spark starts. The scenarios
that wait for a real expiry are arranged when the session starts (``support.expiry_fixtures``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chaos import maintenance
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.common import (
    make_processor,
    produce_json,
    read_slice,
    sink_channel,
    sink_group_offset,
    write_checkpoint_batch,
)
from support.expiry_fixtures import Expired, idle_log
from support.sink_factory import SinkFactory

from fanout_sink.protocol import channel, legacy_names
from fanout_sink.protocol.slices import Slice
from fanout_sink.spark import planning

EARLIEST, LATEST = {"starting-offsets": "earliest"}, {"starting-offsets": "latest"}


def _starting(option: str, topic: str) -> dict[int, int]:
    return {int(p): o for p, o in json.loads(option)[topic].items()}


def test_expired_offsets_fall_back_to_the_legacy_named_group(
    expiring_broker: str, sink_factory: SinkFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """An existing deployment's offsets live in the '-' named group and the control topic has no
    DataComplete for the partition: the legacy group's offset is restored under the new name."""
    made = sink_factory(bootstrap=expiring_broker, partitions={"src": 1}, prefix="l", source=EARLIEST)
    bootstrap, sink, topic, config = expiring_broker, made.name, made.topic, made.config
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    channel.ensure_control_topic(made.channel)
    legacy = Consumer({"bootstrap.servers": bootstrap, "group.id": legacy_names.legacy_sink_group(sink)})
    legacy.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    legacy.close()
    with caplog.at_level(logging.INFO):
        starting = planning.plan_start(config, sink_channel(config), {topic: 1})
    assert _starting(starting, topic) == {0: 4}
    assert sink_group_offset(bootstrap, sink, topic, 0) == 4
    assert "legacy" in caplog.text and "migrated" in caplog.text


def test_partition_never_written_keeps_the_checkpoint_position_under_latest(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """Partition 1 never had a record; with `latest`, records produced to it while the app was down
    must still be read: the checkpoint (which has partition 1 at 0) is kept, not moved aside."""
    sink = sink_factory(partitions={"src": 2}, prefix="n", tables="ab", source=LATEST)
    topic, config = sink.topic, sink.config
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(5)])
    worker = sink.worker()
    sink.deliver(worker, 5)
    worker.close()
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 5, 1: 0}}, starts={topic: {0: 0, 1: 0}})
    produce_json(bootstrap_servers, topic, 1, [{"id": 100 + i, "table": "a"} for i in range(3)])  # app down

    planning.plan_start(config, sink_channel(config), {topic: 2})

    assert (checkpoint / "commits" / "0").exists(), "the checkpoint was moved aside: partition 1 skipped"
    # The next batch starts where batch 0 ended: partition 1's records [0, 3) are planned.
    assert planning.last_committed_ends(str(checkpoint)) == {(topic, 0): 5, (topic, 1): 0}


def test_truncated_control_history_trusts_the_checkpoint_else_warns(
    bootstrap_servers: str, sink_factory: SinkFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No sink-group offset, nothing in the control topic, whose history was cut (delete_records):
    partition 0 is in the checkpoint (its position is trusted), partition 1 is not (the configured
    start, with a WARNING naming it)."""
    sink = sink_factory(partitions={"src": 2}, prefix="t", source=EARLIEST)
    topic, config = sink.topic, sink.config
    conf = {"bootstrap.servers": bootstrap_servers}
    channel.ensure_control_topic(sink.channel)
    produce_json(bootstrap_servers, config.control_topic, 0, [{"noise": i} for i in range(3)])
    admin = AdminClient(conf)
    admin.delete_records([TopicPartition(config.control_topic, 0, 3)])[
        TopicPartition(config.control_topic, 0, 3)
    ].result(30)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(7)])
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 7}})

    with caplog.at_level(logging.WARNING):
        starting = planning.plan_start(config, sink_channel(config), {topic: 2})

    assert (checkpoint / "commits" / "0").exists()
    assert _starting(starting, topic) == {0: 7, 1: -2}
    assert f"{topic}[1]" in caplog.text


def test_checkpoint_claiming_deliveries_the_sink_never_made_is_moved_aside(
    bootstrap_servers: str, sink_factory: SinkFactory
) -> None:
    """A copied checkpoint (another sink's) moved a partition this sink never delivered from 0 to 4:
    that claim is ahead of the sink, so the checkpoint goes and the stream starts where it began."""
    sink = sink_factory(partitions={"src": 1}, prefix="c", source=LATEST)
    topic, config = sink.topic, sink.config
    channel.ensure_control_topic(sink.channel)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 4}}, starts={topic: {0: 0}})

    starting = planning.plan_start(config, sink_channel(config), {topic: 1})

    assert not checkpoint.exists() and list(checkpoint.parent.glob(f"{checkpoint.name}.stale-*"))
    assert _starting(starting, topic) == {0: 0}


# The scenarios below need the broker to expire offsets for real, about a minute after their last
# commit: they are arranged at the session's start (support/expiry_fixtures.py) and the ``expired``
# fixture hands them over once the broker expired what each waits for.


def test_expired_sink_group_offsets_are_recovered_from_the_control_topic_and_restored(
    expired: Expired,
) -> None:
    """Deliver [0, 6) of a partition, let the broker expire the sink group's offset for real, restart
    the planning: the checkpoint stays, the stream starts at 6 (not `earliest`), and the offset is
    back in the sink group, so the worker's overlap/gap check works again."""
    s = expired.recovered

    starting = planning.plan_start(s.config, sink_channel(s.config), {s.topic: 1})

    assert (s.checkpoint / "commits" / "0").exists(), "the checkpoint was moved aside"
    assert _starting(starting, s.topic) == {0: 6}
    assert sink_group_offset(s.bootstrap, s.name, s.topic, 0) == 6


def test_idle_partition_offset_survives_retention_while_the_coordinator_runs(expired: Expired) -> None:
    """Deliver [0, 3) of a partition, then nothing more (idle). A canary group's offset, committed
    right after, expired for real; the sink group's offset must still be there: the running
    coordinator re-committed it (interval 10 s, under the broker's one-minute retention)."""
    s = expired.idle

    assert sink_group_offset(s.bootstrap, s.name, s.topic, 0, stable=False) == 3
    child = expired.idle_coordinator
    output = "" if child.poll() is None else idle_log(s).read_text()[-3000:]
    assert child.returncode is None, f"the coordinator exited {child.returncode}: {output}"


def test_positions_survive_expiry_and_retention_together_through_the_last_round(expired: Expired) -> None:
    """Deliver [0, 6) and [6, 9) of a partition; Spark's checkpoint only committed the first batch
    (the app died before writing commits/1, as a SIGKILL leaves it). A coordinator round ran; then
    retention deleted every acknowledged control event (delete_records up to the coordinator's low
    watermark) and the broker expired the sink group's offset for real. Nothing in the retained log
    is a DataComplete, so the position must come from what the last CommitComplete carried forward:
    9, not the checkpoint's 6 (which would deliver [6, 9) again)."""
    s = expired.last_round

    starting = planning.plan_start(s.config, sink_channel(s.config), {s.topic: 1})

    assert sink_group_offset(s.bootstrap, s.name, s.topic, 0) == 9
    assert _starting(starting, s.topic) == {0: 9}


def test_a_replayed_slice_after_the_offset_expired_while_running_is_not_delivered_again(
    expired: Expired,
) -> None:
    """Real: the broker expired the sink group's offset while the sink "ran" (a broker outage longer
    than offsets.retention.minutes does this), then Spark replays the batch whose transaction had
    committed. The worker must find the delivered position on the control topic instead of
    delivering the range again."""
    s = expired.replayed

    replay = expired.replay_worker.commit_slice(
        Slice(s.topic, 0, 0, 6), read_slice(s.bootstrap, s.topic, 0, 0, 6), make_processor(s.catalog)
    )

    assert not replay.transaction_committed and replay.skipped_delivered == 6
    assert sink_group_offset(s.bootstrap, s.name, s.topic, 0) == 6


@pytest.mark.chaos
def test_a_broker_with_the_chaos_retention_really_expires_a_memberless_groups_offsets(
    expired: Expired,
) -> None:
    """Real: a broker with the chaos run's retention (``kills.BROKER_PROPERTIES``) deletes the offsets
    of a group that never joined, as it would after 7 days by default; only the duration is compressed."""
    m = expired.memberless

    assert m.committed == [0, 0]
    assert maintenance.group_expired(m.bootstrap, m.group, [m.topic], timeout_s=300)
