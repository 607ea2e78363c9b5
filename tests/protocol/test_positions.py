"""Where delivery resumes when the sink group has no offset (issue 11, scenarios 3 and 4).

Real: the broker (a private one whose ``offsets.retention.minutes`` is 1 and whose retention check
runs every second, so the sink group's offsets really expire), workers' transactions, the control
topic's DataComplete events, AdminClient.delete_records, a running coordinator thread. Simulated:
Spark's checkpoint, written file by file the way Spark 4 writes it
(``support.common.write_checkpoint_batch``), and the restart, which is the start-up planning
(``planning.plan_start``) the app runs before Spark starts.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.common import (
    create_tables,
    make_processor,
    produce_json,
    read_slice,
    sink_group_offset,
    write_checkpoint_batch,
)

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config import SinkConfig, parse_config
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.protocol import channel
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark import planning

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def expiring_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker that expires a memberless group's offsets one minute after their last commit."""
    broker = KafkaBroker(
        tmp_path_factory.mktemp("expiring-kafka"),
        properties={"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"},
    )
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


def test_expired_sink_group_offsets_are_recovered_from_the_control_topic_and_restored(
    expiring_broker: str, catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    """Deliver [0, 6) of a partition, let the broker expire the sink group's offset for real, restart
    the planning: the checkpoint stays, the stream starts at 6 (not `earliest`), and the offset is
    back in the sink group, so the worker's overlap/gap check works again."""
    bootstrap, sink = expiring_broker, f"e{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    config = _config(bootstrap, sink, topic, catalog_settings, tmp_path, "earliest")
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    worker = SliceWorker(sink, config.kafka, config.control_topic)
    _deliver(worker, bootstrap, topic, 0, 6, catalog)
    worker.close()
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 6}})
    _wait_until_expired(bootstrap, channel.sink_group(sink), topic, 0)

    starting = planning.plan_start(config, {topic: 1})

    assert (checkpoint / "commits" / "0").exists(), "the checkpoint was moved aside"
    assert _starting(starting, topic) == {0: 6}
    assert sink_group_offset(bootstrap, sink, topic, 0) == 6


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


def test_idle_partition_offset_survives_retention_while_the_coordinator_runs(
    expiring_broker: str, catalog: Any, catalog_settings: CatalogSettings
) -> None:
    """Deliver [0, 3) of a partition, then nothing more (idle). A canary group's offset, committed
    right after, expires for real; the sink group's offset must still be there: the running
    coordinator re-committed it (interval 10 s, under the broker's one-minute retention)."""
    bootstrap, sink = expiring_broker, f"r{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    conf = {"bootstrap.servers": bootstrap}
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(3)])
    worker = SliceWorker(sink, conf, f"{sink}-control")
    _deliver(worker, bootstrap, topic, 0, 3, catalog)
    worker.close()
    canary = Consumer({**conf, "group.id": f"canary-{sink}"})
    canary.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    canary.close()
    coordinator = Coordinator(
        sink,
        conf,
        f"{sink}-control",
        catalog,
        source_topics=[topic],
        commit_interval_s=1.0,
        offsets_refresh_interval_s=10.0,
    )
    coordinator.start()
    try:
        _wait_until_expired(bootstrap, f"canary-{sink}", topic, 0)
        assert sink_group_offset(bootstrap, sink, topic, 0, stable=False) == 3
        assert coordinator.error is None
    finally:
        coordinator.stop(commit_now=False)
        coordinator.close()


def test_positions_survive_expiry_and_retention_together_through_the_last_round(
    expiring_broker: str, catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    """Deliver [0, 6) and [6, 9) of a partition; Spark's checkpoint only committed the first batch
    (the app died before writing commits/1, as a SIGKILL leaves it). A coordinator round runs; then
    retention deletes every acknowledged control event (delete_records up to the coordinator's low
    watermark) and the broker expires the sink group's offset for real. Nothing in the retained log
    is a DataComplete, so the position must come from what the last CommitComplete carried forward:
    9, not the checkpoint's 6 (which would deliver [6, 9) again)."""
    bootstrap, sink = expiring_broker, f"r{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    config = _config(bootstrap, sink, topic, catalog_settings, tmp_path, "earliest")
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(9)])
    worker = SliceWorker(sink, config.kafka, config.control_topic)
    _deliver(worker, bootstrap, topic, 0, 6, catalog)
    _deliver(worker, bootstrap, topic, 0, 9, catalog)
    worker.close()
    checkpoint = Path(config.checkpoint_location)
    write_checkpoint_batch(checkpoint, 0, {topic: {0: 6}})
    coordinator = Coordinator(sink, config.kafka, config.control_topic, catalog, source_topics=[topic])
    coordinator.open()
    watermark = coordinator.commit_round().low_watermark
    coordinator.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    cut = TopicPartition(config.control_topic, 0, watermark)
    admin.delete_records([cut])[cut].result(30)
    _wait_until_expired(bootstrap, channel.sink_group(sink), topic, 0)

    starting = planning.plan_start(config, {topic: 1})

    assert sink_group_offset(bootstrap, sink, topic, 0) == 9
    assert _starting(starting, topic) == {0: 9}


def test_a_replayed_slice_after_the_offset_expired_while_running_is_not_delivered_again(
    expiring_broker: str, catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    """Real: the broker expires the sink group's offset while the sink "runs" (a broker outage longer
    than offsets.retention.minutes does this), then Spark replays the batch whose transaction had
    committed. The worker must find the delivered position on the control topic instead of
    delivering the range again."""
    bootstrap, sink = expiring_broker, f"w{uuid.uuid4().hex[:6]}"
    topic = _topic(bootstrap, 1)
    config = _config(bootstrap, sink, topic, catalog_settings, tmp_path, "earliest")
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap, topic, 0, [{"id": i, "table": "a"} for i in range(6)])
    worker = SliceWorker(sink, config.kafka, config.control_topic)
    _deliver(worker, bootstrap, topic, 0, 6, catalog)
    _wait_until_expired(bootstrap, channel.sink_group(sink), topic, 0)

    replay = worker.commit_slice(
        topic, 0, 0, 6, read_slice(bootstrap, topic, 0, 0, 6), make_processor(catalog)
    )
    worker.close()

    assert not replay.transaction_committed and replay.skipped_delivered == 6
    assert sink_group_offset(bootstrap, sink, topic, 0) == 6
