"""The native consume: the range reader's records copied from librdkafka into Arrow buffers in C
(``librdkafka_arrow.c``), about a fifth of the CPU per record of confluent-kafka's ``consume``,
with that one as the automatic fallback.

The extension is built when the project is installed (``setup.py``: optional, so an install
without a C compiler still succeeds) and consumes on the reader's own confluent-kafka ``Consumer``;
assignment, pause, seek and the callbacks stay confluent-kafka's. It reads confluent-kafka's C
handle, so it is used only with the confluent-kafka versions it was checked against
(:data:`CHECKED_CONFLUENT_KAFKA`), and each consumer is checked before its first consume.

Which consume a process uses is logged once, at INFO, when its first reader is made; for the
fallback with the reason and what to do. ``FANOUT_SINK_READER=python`` forces the fallback (in the
app's environment, which local executors inherit; ``spark.executorEnv.FANOUT_SINK_READER`` on a
cluster).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import confluent_kafka
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError

from fanout_sink.kafka.consumed import RAW_RECORD_SCHEMA, Consume, Consumed, python_consume

log = logging.getLogger(__name__)

READER_ENV = "FANOUT_SINK_READER"
"""``python``: use confluent-kafka's consume even where the native one is built."""

CHECKED_CONFLUENT_KAFKA = frozenset({"2.16.1"})
"""confluent-kafka versions whose C ``Handle`` the extension's mirror was checked against."""

_BUILD_HINT = (
    "install a C compiler and Python's headers (Debian/Ubuntu: apt-get install gcc python3-dev) and "
    "reinstall fanout-sink (in a checkout: rm .venv/.fanout-sink-installed, then "
    "python3 -m fanout_sink.bootstrap test --tier fast tests/test_config.py)"
)
_HEADERS = RAW_RECORD_SCHEMA.field("headers").type
_LIBRDKAFKA = re.compile(r"librdkafka(-[0-9a-f]+)?\.so")
"""librdkafka's file name: the system's ``librdkafka.so.1``, or a wheel's ``librdkafka-<hash>.so.1``."""


def loaded_librdkafka() -> Path | None:
    """The librdkafka confluent-kafka loaded into this process (the wheel's bundled copy, or the
    system's), from the process's memory map; ``None`` where there is no ``/proc`` (not Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and _LIBRDKAFKA.match(Path(fields[5]).name):
            return Path(fields[5].strip())
    return None


@functools.cache
def native_module() -> tuple[ModuleType | None, str]:
    """The bound extension and the line saying so, or ``None`` and the line saying why not."""
    fallback = "Kafka reader: confluent-kafka's consume (Python, ~5x the CPU per record of the native one)"
    if os.environ.get(READER_ENV, "").lower() == "python":
        return None, f"{fallback}: {READER_ENV}=python"
    try:
        extension = importlib.import_module("fanout_sink.kafka.librdkafka_arrow")
    except ImportError as error:
        return None, f"{fallback}: the native reader is not built ({error}); {_BUILD_HINT}"
    version = str(confluent_kafka.__version__)
    if version not in CHECKED_CONFLUENT_KAFKA:
        checked = ", ".join(sorted(CHECKED_CONFLUENT_KAFKA))
        return None, (
            f"{fallback}: the native reader was checked against confluent-kafka {checked}, this is "
            f"{version}; install fanout-sink's pinned confluent-kafka"
        )
    library = loaded_librdkafka()
    if library is None:
        return None, f"{fallback}: librdkafka not found in this process's memory map (not Linux?)"
    try:
        librdkafka = extension.bind(str(library))
    except ImportError as error:
        return None, f"{fallback}: {error}"
    return extension, f"Kafka reader: native (C over librdkafka {librdkafka}, {library.name})"


def choose_consume(consumer: Consumer) -> Consume:
    """The native consume on ``consumer`` where it is built and the consumer passes its check, else
    confluent-kafka's (:func:`~fanout_sink.kafka.consumed.python_consume`)."""
    module, line = native_module()
    log_once(line)
    if module is None:
        return python_consume(consumer)
    try:
        module.check(consumer)
    except (RuntimeError, TypeError) as error:
        _warn_once(f"Kafka reader: confluent-kafka's consume for this consumer: {error}")
        return python_consume(consumer)
    return functools.partial(_consume, module, consumer)


@functools.cache
def log_once(line: str) -> None:
    """``line`` at INFO, the first time in this process: which consume its readers use."""
    log.info(line)


@functools.cache
def _warn_once(line: str) -> None:
    log.warning(line)


def _consume(module: Any, consumer: Consumer, max_messages: int, timeout_s: float) -> Consumed:
    segments, events = module.consume(consumer, max_messages, round(timeout_s * 1000))
    runs = [run for segment in segments for run in _runs(segment)]
    return Consumed(runs, [_event(*event) for event in events])


def _event(topic: str | None, partition: int, offset: int, code: int, text: str) -> Any:
    key = None if topic is None else (topic, partition)
    return key, offset, KafkaError(code, text)


def _runs(segment: tuple[Any, ...]) -> list[tuple[tuple[str, int], pa.RecordBatch]]:
    """One segment's record batches, one per partition run: its columns built once, sliced per run."""
    rows, runs, key, value, offsets, stamps, kinds, headers = segment
    columns = [
        _binary(pa.binary(), rows, key),
        _binary(pa.binary(), rows, value),
        pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)], null_count=0),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows, [None, pa.py_buffer(stamps)], null_count=0),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(kinds)], null_count=0),
        _headers_column(rows, headers),
    ]
    batches = []
    for topic, partition, first, count in runs:
        k, v, o, s, t, h = (c if count == rows else c.slice(first, count) for c in columns)
        topics = pa.repeat(pa.scalar(topic, pa.string()), count)
        partitions = pa.repeat(pa.scalar(partition, pa.int32()), count)
        batch = pa.RecordBatch.from_arrays([k, v, topics, partitions, o, s, t, h], schema=RAW_RECORD_SCHEMA)
        batches.append(((topic, partition), batch))
    return batches


def _binary(kind: pa.DataType, count: int, column: tuple[Any, ...]) -> pa.Array:
    valid, nulls, offsets, data = column
    buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, count, buffers, null_count=nulls)


def _headers_column(count: int, headers: tuple[Any, ...] | None) -> pa.Array:
    """Null where a record has no headers (as confluent-kafka's ``headers()`` is None); else lists of
    key/value structs. Header names are checked as UTF-8 (a string column), as confluent-kafka did."""
    if headers is None:
        return pa.nulls(count, _HEADERS)
    valid, nulls, offsets, name_offsets, names, value_valid, value_nulls, value_offsets, values = headers
    entries = len(name_offsets) // 4 - 1
    keys = _binary(pa.string(), entries, (None, 0, name_offsets, names))
    keys.validate(full=True)
    vals = _binary(pa.binary(), entries, (value_valid, value_nulls, value_offsets, values))
    struct = pa.StructArray.from_arrays([keys, vals], fields=list(_HEADERS.value_type))
    buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets)]
    return pa.Array.from_buffers(_HEADERS, count, buffers, null_count=nulls, children=[struct])
