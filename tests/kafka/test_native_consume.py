"""The native consume without a broker: built where it can be, checked before use, and the fallback
to confluent-kafka's consume logged once with its reason. Its records against the fallback's, on a
broker: test_range_reader.py (every test both ways) and test_native_and_python_consumes_agree."""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.common import use_reader

from fanout_sink.kafka import native_consume, range_reader
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.consumed import Consumed
from fanout_sink.kafka.native_consume import choose_consume, native_module
from fanout_sink.kafka.range_reader import RangeReader

LOGGER = native_consume.__name__


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    """A consumer of a broker that is not there (port 9): a consume finds nothing."""
    made = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "enable.partition.eof": True})
    yield made
    made.close()


def _compiler_and_headers() -> bool:
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(compiler) is not None and headers.is_file()


def test_the_native_consume_is_built_where_a_compiler_and_pythons_headers_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The install builds it (setup.py, optional): a failed build would only show as a slower reader,
    so the suite fails instead where the build should have worked."""
    if not _compiler_and_headers():
        pytest.skip("no C compiler or Python.h here: the fallback is what this machine runs")
    use_reader("python", monkeypatch)  # uncached; "native" would skip where it is missing
    monkeypatch.delenv(native_consume.READER_ENV)
    module, line = native_module()
    assert module is not None, line
    assert line.startswith("Kafka reader: native (C over librdkafka ")


def test_forcing_the_python_consume_logs_it_once_with_the_reason(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use_reader("python", monkeypatch)
    native_consume.log_once.cache_clear()
    with caplog.at_level(logging.INFO, LOGGER):
        consume = choose_consume(consumer)
        choose_consume(consumer)
    assert consume(10, 0.0) == Consumed([], [])
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == [
        "Kafka reader: confluent-kafka's consume (Python, ~5x the CPU per record of the native one): "
        "FANOUT_SINK_READER=python"
    ]


def test_without_the_extension_the_reader_falls_back_saying_what_to_install(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use_reader("python", monkeypatch)
    monkeypatch.delenv(native_consume.READER_ENV)
    monkeypatch.setitem(sys.modules, "fanout_sink.kafka.librdkafka_arrow", None)  # import fails
    native_consume.log_once.cache_clear()
    with caplog.at_level(logging.INFO, LOGGER):
        choose_consume(consumer)(10, 0.0)
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "the native reader is not built" in line
    assert "apt-get install gcc python3-dev" in line and "reinstall fanout-sink" in line


def test_a_confluent_kafka_it_was_not_checked_against_falls_back(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_reader("python", monkeypatch)
    monkeypatch.delenv(native_consume.READER_ENV)
    monkeypatch.setattr(native_consume.confluent_kafka, "__version__", "9.9.9")
    module, line = native_module()
    assert module is None
    assert "checked against confluent-kafka 2.16.1, this is 9.9.9" in line


def test_the_native_consume_on_an_idle_consumer_returns_nothing_and_refuses_a_closed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty batch (the broker is not there) is no crash; a closed consumer is an error, not a
    read of freed memory; an object that is not a Consumer is refused by the check."""
    use_reader("native", monkeypatch)
    module, _ = native_module()
    assert module is not None
    made = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
    consume = choose_consume(made)
    assert isinstance(consume, functools.partial)
    assert consume(10, 0.0) == Consumed([], [])
    with pytest.raises(ValueError, match="max_messages"):
        consume(0, 0.0)
    made.close()
    with pytest.raises(RuntimeError, match="Consumer closed"):
        consume(10, 0.0)
    with pytest.raises(TypeError, match=r"not a confluent_kafka\.Consumer"):
        module.check(object())


def test_a_callback_that_raises_during_a_native_consume_raises_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka serves the error callback from the consumer queue, inside the consume: its
    exception must come out of the consume (as from confluent-kafka's), not crash or vanish."""
    use_reader("native", monkeypatch)

    def error_cb(error: object) -> None:
        raise LookupError("from error_cb")

    made = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "error_cb": error_cb})
    consume = choose_consume(made)
    try:
        with pytest.raises((LookupError, RuntimeError), match="from error_cb"):
            for _ in range(50):  # the connection refusal comes within a few hundred ms
                consume(10, 0.1)
    finally:
        made.close()


def _edge_records(bootstrap: str, topic: str) -> None:
    """Headers (a null value, an empty one, a non-ASCII name), tombstones, null and empty keys and
    values, over committed, aborted and committed transactions, then plain records: markers and
    aborted records fall inside ranges and at their ends."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"edges-{topic}", "linger.ms": 5}
    )
    producer.init_transactions(30)
    for first, commit in ((0, True), (100, False), (200, True), (300, True)):
        producer.begin_transaction()
        for i in range(first, first + 20):
            headers = [("h", b"v%d" % i), ("n", None), ("ü", b"")] if i % 3 == 0 else None
            key = None if i % 5 == 0 else (b"" if i % 7 == 0 else b"k%d" % i)
            value = None if i % 4 == 0 else (b"" if i % 6 == 0 else b"value %d" % i)
            producer.produce(topic, value, key=key, headers=headers, partition=i % 2)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        plain.produce(topic, b"plain %d" % i, partition=i % 2, timestamp=1_700_000_000_000 + i)
    plain.flush(30)


def test_native_and_python_consumes_read_the_same_tables(
    bootstrap_servers: str, make_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ranges read by a reader on each consume, compared whole (chunk sizes too): alone,
    and inside a partition group whose small ranges are fetched ahead."""
    topic, other = make_topic("native-edges", partitions=2), make_topic("native-edges", partitions=2)
    _edge_records(bootstrap_servers, topic)
    _edge_records(bootstrap_servers, other)
    kafka = KafkaClientFactory({"bootstrap.servers": bootstrap_servers})
    use_reader("python", monkeypatch)
    python = RangeReader(kafka, "fanout-sink:native-edges", stall_timeout_s=10.0)
    use_reader("native", monkeypatch)
    native = RangeReader(kafka, "fanout-sink:native-edges", stall_timeout_s=10.0)
    try:
        ends = {p: python._consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in (0, 1)}

        def same(start: int, stop: int, partition: int) -> None:
            want = list(python.read_chunks(topic, partition, start, stop, 7))
            got = list(native.read_chunks(topic, partition, start, stop, 7))
            assert [t.num_rows for t in got] == [t.num_rows for t in want], (partition, start, stop)
            if want:
                assert pa.concat_tables(got).equals(pa.concat_tables(want)), (partition, start, stop)

        whole = python.read(topic, 0, 0, ends[0])
        assert whole.num_rows == 3 * 10 + 10 and whole["headers"].null_count < whole.num_rows
        for partition, end in ends.items():
            for start, stop in [(0, end), (0, 11), (3, 12), (10, 23), (11, 22), (20, 33), (end - 1, end)]:
                same(start, min(stop, end), partition)
        monkeypatch.setattr(range_reader, "AHEAD_RECORDS", 25)
        # One range per partition (an assignment names each once), small enough to be fetched ahead.
        plan = [(topic, 0, 0, 11), (other, 1, 3, 23), (topic, 1, 11, 33), (other, 0, 0, ends[0])]
        tables: list[list[pa.Table]] = [[], []]
        for reader, out in zip((python, native), tables, strict=True):
            with reader.assigned(plan):
                out.extend(reader.read(t, p, a, b) for t, p, a, b in plan)
        for (_, p, a, b), want, got in zip(plan, *tables, strict=True):
            assert got.equals(want), (p, a, b)
    finally:
        python.close()
        native.close()
