"""Where each source partition stands, as the coordinator's rounds, ``status`` and the lag metric read it."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import PartitionPosition, source_positions


def test_ends_are_last_stable_offsets_of_every_partition_of_the_topics(
    bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    first, second = make_topic("pos", partitions=2), make_topic("pos")
    plain = Producer({"bootstrap.servers": bootstrap_servers})
    for _ in range(5):
        plain.produce(first, b"x", partition=0)
    plain.produce(first, b"x", partition=1)
    plain.produce(second, b"x", partition=0)
    plain.flush(30)
    # An open transaction holds partition 1's last stable offset at 1, below its high watermark.
    open_txn = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": uuid.uuid4().hex})
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    open_txn.produce(first, b"pending", partition=1)
    open_txn.flush(30)
    group = f"pos-{uuid.uuid4().hex[:6]}"
    committer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group})
    committer.commit(offsets=[TopicPartition(first, 0, 3)], asynchronous=False)
    committer.close()
    try:
        positions = source_positions(
            KafkaClientFactory({"bootstrap.servers": bootstrap_servers}), group, [first, second, "absent"]
        )
    finally:
        open_txn.abort_transaction(30)
    assert positions == [
        PartitionPosition(first, 0, 3, 5),
        PartitionPosition(first, 1, None, 1),
        PartitionPosition(second, 0, None, 1),
    ]
    assert [p.lag for p in positions] == [2, 1, 1]
    assert (
        source_positions(KafkaClientFactory({"bootstrap.servers": bootstrap_servers}), group, ["absent"])
        == []
    )
