"""``dead-letter.connect-headers``: Kafka Connect's ``__connect.errors.*`` headers beside ours, through a
real broker, encoded as Connect's DeadLetterQueueReporter encodes them (UTF-8 text, decimal numbers)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from support.raw_slices import from_messages
from support.sink_factory import SinkFactory

from fanout_sink.config.topics import DeadLetterSettings
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor

# Kafka Connect's org.apache.kafka.connect.runtime.errors.Stage constants.
CONNECT_STAGES = {
    "KEY_CONVERTER", "VALUE_CONVERTER", "HEADER_CONVERTER", "TRANSFORMATION",
    "TASK_PUT", "TASK_POLL", "KAFKA_PRODUCE", "KAFKA_CONSUME",
}  # fmt: skip
CONNECT_HEADERS = [
    "topic", "partition", "offset", "connector.name", "task.id", "stage", "class.name",
    "exception.class.name", "exception.message", "exception.stacktrace",
]  # fmt: skip


def test_connect_headers_beside_ours_decode_as_connect_tooling_reads_them(
    make_topic: Callable[..., str], sink_factory: SinkFactory, read_topic: Callable[..., list[Any]]
) -> None:
    dlq = make_topic("dlq")
    routes = {"tables": {"analytics.orders": {"when": "type == 'order'"}}, "dynamic": None}
    sink = sink_factory(
        partitions={"orders": 2},
        name="shop",
        source={"tombstones": "dead-letter"},
        overrides={
            **routes,
            "unmatched": {"action": "dead-letter"},
            "dead-letter": {"topic": dlq, "connect-headers": True},
        },
    )
    source = sink.topic
    producer = Producer({"bootstrap.servers": sink.bootstrap})
    producer.produce(source, key=b"k0", value=json.dumps({"type": "order", "id": 1}).encode(), partition=1)
    producer.produce(source, key=b"k1", value=b"{not json", partition=1, headers=[("trace", b"t1")])
    producer.produce(source, key=b"k2", value=json.dumps({"type": "refund", "id": 2}).encode(), partition=1)
    producer.produce(source, key=b"k3", value=None, partition=1)
    producer.flush(30)
    raw = from_messages(read_topic(source))
    out = build_processor(sink.config, sink.catalog)(raw)
    assert len(out.dead_letters) == 3, (raw.num_rows, out.dead_letters)
    txn = Producer({"bootstrap.servers": sink.bootstrap, "transactional.id": f"{dlq}-worker"})
    txn.init_transactions(30)
    txn.begin_transaction()
    deadletter.publish(txn, dlq, out.dead_letters, 1_000_000)
    txn.commit_transaction(30)

    deadline = time.monotonic() + 30
    letters = read_topic(dlq)
    while len(letters) < 3 and time.monotonic() < deadline:  # a fresh topic's end may show late
        letters = read_topic(dlq)
    assert [m.key() for m in letters] == [b"k1", b"k2", b"k3"]
    expected = {
        b"k1": ("decode", "VALUE_CONVERTER", "fanout_sink.transform.formats.json.JsonDecoder", 1),
        b"k2": ("route", "TRANSFORMATION", "fanout_sink.transform.routing.Router", 2),
        b"k3": ("tombstone", "TASK_PUT", "fanout_sink.transform.processor.RoutingProcessor", 3),
    }
    for message in letters:
        ours, stage, executing, offset = expected[message.key()]
        # Connect's tooling reads header values as UTF-8 strings (StringConverter), numbers as decimals.
        connect = {
            name[len("__connect.errors.") :]: value.decode("utf-8")
            for name, value in message.headers()
            if name.startswith("__connect.errors.")
        }
        assert list(connect) == CONNECT_HEADERS, "each once, in Connect's order"
        assert connect["topic"] == source
        assert int(connect["partition"]) == 1 and int(connect["offset"]) == offset
        assert connect["connector.name"] == "shop" and int(connect["task.id"]) == 1
        assert connect["stage"] == stage and stage in CONNECT_STAGES
        assert connect["class.name"] == executing
        assert connect["exception.class.name"] == "fanout_sink.errors.RecordError"
        assert connect["exception.message"].startswith(f"record {source}[1]@{offset} failed at {ours}: ")
        assert connect["exception.stacktrace"].startswith(
            f"fanout_sink.errors.RecordError: {connect['exception.message']}"
        )
        ours_headers = dict(message.headers())
        assert ours_headers[deadletter.STAGE] == ours.encode(), "our headers stay"
        assert ours_headers[deadletter.SOURCE_OFFSET] == str(offset).encode()
    assert dict(letters[0].headers())["trace"] == b"t1", "the source record's headers stay"

    # Off by default: our headers only.
    without = sink.config.model_copy(update={"dead_letter": DeadLetterSettings(topic=dlq)})
    plain = build_processor(without, sink.catalog)(raw)
    assert not [n for letter in plain.dead_letters for n, _ in letter.headers if n.startswith("__connect")]


def test_a_record_carrying_connect_headers_already_keeps_them_as_connect_does() -> None:
    raw = {
        "topic": "orders",
        "partition": 0,
        "offset": 9,
        "key": None,
        "value": b"x",
        "timestamp": None,
        "headers": [{"key": "__connect.errors.topic", "value": b"upstream"}],
    }
    letter = deadletter.dead_letter(
        raw, sink="shop", stage="decode", reason="invalid JSON", connect_class="my.Decoder"
    )
    topics = [value for name, value in letter.headers if name == "__connect.errors.topic"]
    assert topics == [b"upstream"]
    stage = [value for name, value in letter.headers if name == "__connect.errors.stage"]
    assert stage == [b"VALUE_CONVERTER"]
