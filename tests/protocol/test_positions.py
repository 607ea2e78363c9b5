"""Where delivery resumes when the sink group has no offset (issue 11, scenarios 3 and 4).

Real: the broker (a private one with the chaos run's retention, ``kills.BROKER_PROPERTIES``:
``offsets.retention.minutes`` is 1 and the retention check runs every 5 s, so the sink group's
offsets really expire), workers' transactions, the control
topic's DataComplete events, AdminClient.delete_records, a running coordinator thread. Simulated:
Spark's checkpoint, written file by file the way Spark 4 writes it
(``support.common.write_checkpoint_batch``), and the restart, which is the start-up planning
(``planning.plan_start``) the app runs before Spark starts. The scenarios that wait for a real
expiry share one wait (module fixture ``expired``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.common import (
    create_tables,
    embedded_catalog_settings,
    make_processor,
    produce_json,
    read_slice,
    sink_group_offset,
    write_checkpoint_batch,
)

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config import SinkConfig, parse_config
from fanout_sink.devtools.chaos import kills, maintenance
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol import channel
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark import planning

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def expiring_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker that expires a memberless group's offsets one minute after their last commit."""
    broker = KafkaBroker(tmp_path_factory.mktemp("expiring-kafka"), properties=kills.BROKER_PROPERTIES)
    broker.start()
    yield broker.bootstrap_servers
    broker.stop()


def _config(
    bootstrap: str, sink: str, topic: str, settings: CatalogSettings, tmp: Path, start: str
) -> SinkConfig:
    return parse_config(
        {
            "name": sink,
            "kafka": {"bootstrap.servers": bootstrap},
            "source": {"topics": [topic], "format": "json", "starting-offsets": start},
            "catalog": settings.model_dump(),
            "tables": {"sink.a": {"when": "table == 'a'"}},
            "spark": {"checkpoint-location": str(tmp / "checkpoints")},
        }
    )


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _deliver(worker: SliceWorker, bootstrap: str, topic: str, partition: int, end: int, catalog: Any) -> None:
    raw = read_slice(bootstrap, topic, partition, 0, end)
    assert worker.commit_slice(topic, partition, 0, end, raw, make_processor(catalog)).transaction_committed


def _wait_until_expired(
    bootstrap: str, group: str, topic: str, partition: int, timeout_s: float = 240
) -> None:
    """Polls the group's committed offset until the broker has expired it (about a minute)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        while consumer.committed([TopicPartition(topic, partition)], timeout=30)[0].offset >= 0:
            assert time.monotonic() < deadline, f"{group} {topic}[{partition}] never expired"
            time.sleep(1)
    finally:
        consumer.close()


def _starting(option: str, topic: str) -> dict[int, int]:
    return {int(p): o for p, o in json.loads(option)[topic].items()}


def test_expired_offsets_fall_back_to_the_legacy_named_group(
    expiring_broker: str, catalog_settings: CatalogSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An existing deployment's offsets live in the '-' named group and the control topic has no
    DataComplete for the partition: the legacy group's offset is restored under the new name."""
    bootstrap, sink = expiring_broker, f"l{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    channel.ensure_control_topic({"bootstrap.servers": bootstrap}, f"{sink}-control")
    legacy = Consumer({"bootstrap.servers": bootstrap, "group.id": channel.legacy_sink_group(sink)})
    legacy.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    legacy.close()
    config = _config(bootstrap, sink, topic, catalog_settings, tmp_path, "earliest")
    with caplog.at_level(logging.INFO):
        starting = planning.plan_start(config, {topic: 1})
    assert _starting(starting, topic) == {0: 4}
    assert sink_group_offset(bootstrap, sink, topic, 0) == 4
    assert "legacy" in caplog.text and "migrated" in caplog.text


def test_partition_never_written_keeps_the_checkpoint_position_under_latest(
    bootstrap_servers: str,
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
) -> None:
    """Partition 1 never had a record; with `latest`, records produced to it while the app was down
    must still be read: the checkpoint (which has partition 1 at 0) is kept, not moved aside."""
    sink = f"n{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap_servers, 2)
    config = _config(bootstrap_servers, sink, topic, catalog_settings, tmp_path, "latest")
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(5)])
    worker = SliceWorker(sink, config.kafka, config.control_topic)
    _deliver(worker, bootstrap_servers, topic, 0, 5, catalog)
    worker.close()
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 5, 1: 0}}, starts={topic: {0: 0, 1: 0}})
    produce_json(bootstrap_servers, topic, 1, [{"id": 100 + i, "table": "a"} for i in range(3)])  # app down

    planning.plan_start(config, {topic: 2})

    assert (checkpoint / "commits" / "0").exists(), "the checkpoint was moved aside: partition 1 skipped"
    # The next batch starts where batch 0 ended: partition 1's records [0, 3) are planned.
    assert planning.last_committed_ends(str(checkpoint)) == {(topic, 0): 5, (topic, 1): 0}


def test_truncated_control_history_trusts_the_checkpoint_else_warns(
    bootstrap_servers: str,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No sink-group offset, nothing in the control topic, whose history was cut (delete_records):
    partition 0 is in the checkpoint (its position is trusted), partition 1 is not (the configured
    start, with a WARNING naming it)."""
    sink = f"t{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap_servers, 2)
    config = _config(bootstrap_servers, sink, topic, catalog_settings, tmp_path, "earliest")
    conf = {"bootstrap.servers": bootstrap_servers}
    channel.ensure_control_topic(conf, config.control_topic)
    produce_json(bootstrap_servers, config.control_topic, 0, [{"noise": i} for i in range(3)])
    admin = AdminClient(conf)
    admin.delete_records([TopicPartition(config.control_topic, 0, 3)])[
        TopicPartition(config.control_topic, 0, 3)
    ].result(30)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(7)])
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 7}})

    with caplog.at_level(logging.WARNING):
        starting = planning.plan_start(config, {topic: 2})

    assert (checkpoint / "commits" / "0").exists()
    assert _starting(starting, topic) == {0: 7, 1: -2}
    assert f"{topic}[1]" in caplog.text


def test_checkpoint_claiming_deliveries_the_sink_never_made_is_moved_aside(
    bootstrap_servers: str, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    """A copied checkpoint (another sink's) moved a partition this sink never delivered from 0 to 4:
    that claim is ahead of the sink, so the checkpoint goes and the stream starts where it began."""
    sink = f"c{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap_servers, 1)
    config = _config(bootstrap_servers, sink, topic, catalog_settings, tmp_path, "latest")
    channel.ensure_control_topic(config.kafka, config.control_topic)
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 4}}, starts={topic: {0: 0}})

    starting = planning.plan_start(config, {topic: 1})

    assert not checkpoint.exists() and list(checkpoint.parent.glob(f"{checkpoint.name}.stale-*"))
    assert _starting(starting, topic) == {0: 0}


# The scenarios below need the broker to expire offsets for real, about a minute after their last
# commit. Each has its own sink, topic and catalog; all are arranged first and the module waits for
# the expiry once (one minute instead of one per scenario).


@dataclass(frozen=True)
class Situation:
    """One scenario's sink on the expiring broker, with its own topic, config and embedded catalog."""

    bootstrap: str
    sink: str
    topic: str
    config: SinkConfig
    catalog: Any

    @property
    def checkpoint(self) -> Path:
        return Path(self.config.checkpoint_location)

    def deliver(self, worker: SliceWorker, end: int) -> None:
        _deliver(worker, self.bootstrap, self.topic, 0, end, self.catalog)


@dataclass(frozen=True)
class Memberless:
    """A group that never joined, with offsets committed on both partitions of its topic."""

    bootstrap: str
    group: str
    topic: str
    committed: list[int | None]


@dataclass(frozen=True)
class Expired:
    """The arranged scenarios after the broker expired the offsets they wait for."""

    memberless: Memberless
    recovered: Situation
    last_round: Situation
    replayed: Situation
    replay_worker: SliceWorker
    idle: Situation
    idle_coordinator: Coordinator


def _situation(bootstrap: str, prefix: str, folder: Path) -> Situation:
    sink = f"{prefix}{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    settings = embedded_catalog_settings(folder)
    catalog = load_catalog(settings)
    create_tables(catalog, ["a", "b"])
    return Situation(
        bootstrap, sink, topic, _config(bootstrap, sink, topic, settings, folder, "earliest"), catalog
    )


def _canary_group(sink: str) -> str:
    return f"canary-{sink}"


def _arrange_memberless(bootstrap: str) -> Memberless:
    """Commit offsets 0 on two partitions for a group that never joins (as the sink group is)."""
    group, topic = f"fanout-sink-m{uuid.uuid4().hex[:6]}", _topic(bootstrap, 2)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)], asynchronous=False)
    consumer.close()
    positions = source_positions({"bootstrap.servers": bootstrap}, group, [topic])
    return Memberless(bootstrap, group, topic, [p.committed for p in positions])


def _arrange_recovered(s: Situation) -> None:
    """Deliver [0, 6); the checkpoint committed batch 0 at 6."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    worker = SliceWorker(s.sink, s.config.kafka, s.config.control_topic)
    s.deliver(worker, 6)
    worker.close()
    write_checkpoint_batch(s.checkpoint, 0, {s.topic: {0: 6}})


def _arrange_idle(s: Situation) -> Coordinator:
    """Deliver [0, 3), commit a canary group at 3, start a coordinator that refreshes every 10 s."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(3)])
    worker = SliceWorker(s.sink, s.config.kafka, s.config.control_topic)
    s.deliver(worker, 3)
    worker.close()
    canary = Consumer({**s.config.kafka, "group.id": _canary_group(s.sink)})
    canary.commit(offsets=[TopicPartition(s.topic, 0, 3)], asynchronous=False)
    canary.close()
    coordinator = Coordinator(
        s.sink,
        s.config.kafka,
        s.config.control_topic,
        s.catalog,
        source_topics=[s.topic],
        commit_interval_s=1.0,
        offsets_refresh_interval_s=10.0,
    )
    coordinator.start()
    return coordinator


def _arrange_last_round(s: Situation) -> None:
    """Deliver [0, 6) and [6, 9); the checkpoint committed only batch 0 (at 6); a coordinator round
    runs, then retention deletes the control events below its low watermark."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(9)])
    worker = SliceWorker(s.sink, s.config.kafka, s.config.control_topic)
    s.deliver(worker, 6)
    s.deliver(worker, 9)
    worker.close()
    write_checkpoint_batch(s.checkpoint, 0, {s.topic: {0: 6}})
    coordinator = Coordinator(
        s.sink, s.config.kafka, s.config.control_topic, s.catalog, source_topics=[s.topic]
    )
    coordinator.open()
    watermark = coordinator.commit_round().low_watermark
    coordinator.close()
    cut = TopicPartition(s.config.control_topic, 0, watermark)
    admin = AdminClient(s.config.kafka)  # kept referenced: a collected client never resolves its futures
    admin.delete_records([cut])[cut].result(30)


def _arrange_replayed(s: Situation) -> SliceWorker:
    """Deliver [0, 6) with a worker that stays open (the sink keeps running)."""
    produce_json(s.bootstrap, s.topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    worker = SliceWorker(s.sink, s.config.kafka, s.config.control_topic)
    s.deliver(worker, 6)
    return worker


@pytest.fixture(scope="module")
def expired(expiring_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Expired]:
    """Every scenario arranged, then one wait until the broker expired each one's awaited offset."""

    def situation(prefix: str) -> Situation:
        return _situation(expiring_broker, prefix, tmp_path_factory.mktemp(f"expiry-{prefix}"))

    idle, recovered, last_round, replayed = (situation(prefix) for prefix in "iery")
    memberless = _arrange_memberless(expiring_broker)  # the first commit: expired by the others' wait
    idle_coordinator = _arrange_idle(idle)
    replay_worker: SliceWorker | None = None
    try:
        _arrange_recovered(recovered)
        _arrange_last_round(last_round)
        replay_worker = _arrange_replayed(replayed)
        for s in (recovered, last_round, replayed):
            _wait_until_expired(expiring_broker, channel.sink_group(s.sink), s.topic, 0)
        _wait_until_expired(expiring_broker, _canary_group(idle.sink), idle.topic, 0)
        yield Expired(memberless, recovered, last_round, replayed, replay_worker, idle, idle_coordinator)
    finally:
        idle_coordinator.stop(commit_now=False)
        idle_coordinator.close()
        if replay_worker is not None:
            replay_worker.close()


def test_expired_sink_group_offsets_are_recovered_from_the_control_topic_and_restored(
    expired: Expired,
) -> None:
    """Deliver [0, 6) of a partition, let the broker expire the sink group's offset for real, restart
    the planning: the checkpoint stays, the stream starts at 6 (not `earliest`), and the offset is
    back in the sink group, so the worker's overlap/gap check works again."""
    s = expired.recovered

    starting = planning.plan_start(s.config, {s.topic: 1})

    assert (s.checkpoint / "commits" / "0").exists(), "the checkpoint was moved aside"
    assert _starting(starting, s.topic) == {0: 6}
    assert sink_group_offset(s.bootstrap, s.sink, s.topic, 0) == 6


def test_idle_partition_offset_survives_retention_while_the_coordinator_runs(expired: Expired) -> None:
    """Deliver [0, 3) of a partition, then nothing more (idle). A canary group's offset, committed
    right after, expired for real; the sink group's offset must still be there: the running
    coordinator re-committed it (interval 10 s, under the broker's one-minute retention)."""
    s = expired.idle

    assert sink_group_offset(s.bootstrap, s.sink, s.topic, 0, stable=False) == 3
    assert expired.idle_coordinator.error is None


def test_positions_survive_expiry_and_retention_together_through_the_last_round(expired: Expired) -> None:
    """Deliver [0, 6) and [6, 9) of a partition; Spark's checkpoint only committed the first batch
    (the app died before writing commits/1, as a SIGKILL leaves it). A coordinator round ran; then
    retention deleted every acknowledged control event (delete_records up to the coordinator's low
    watermark) and the broker expired the sink group's offset for real. Nothing in the retained log
    is a DataComplete, so the position must come from what the last CommitComplete carried forward:
    9, not the checkpoint's 6 (which would deliver [6, 9) again)."""
    s = expired.last_round

    starting = planning.plan_start(s.config, {s.topic: 1})

    assert sink_group_offset(s.bootstrap, s.sink, s.topic, 0) == 9
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
        s.topic, 0, 0, 6, read_slice(s.bootstrap, s.topic, 0, 0, 6), make_processor(s.catalog)
    )

    assert not replay.transaction_committed and replay.skipped_delivered == 6
    assert sink_group_offset(s.bootstrap, s.sink, s.topic, 0) == 6


@pytest.mark.chaos
def test_a_broker_with_the_chaos_retention_really_expires_a_memberless_groups_offsets(
    expired: Expired,
) -> None:
    """Real: a broker with the chaos run's retention (``kills.BROKER_PROPERTIES``) deletes the offsets
    of a group that never joined, as it would after 7 days by default; only the duration is compressed."""
    m = expired.memberless

    assert m.committed == [0, 0]
    assert maintenance.group_expired(m.bootstrap, m.group, [m.topic], timeout_s=300)
