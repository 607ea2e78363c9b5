"""A native range reader (measurement prototype, issue 34 item 1): ``_rangeread.c`` reads one
partition's ``[start, end)`` with librdkafka's ``rd_kafka_consume_batch_queue`` into Arrow column
buffers in C, with no Python object per record; here they become record batches of
:data:`~fanout_sink.kafka.range_reader.RAW_RECORD_SCHEMA`, the columns ``RangeReader`` gives.

:func:`build` compiles the extension with the machine's ``cc`` (``-O2 -shared -fPIC``) against this
Python's headers and links it to the librdkafka inside confluent-kafka's wheel
(``confluent_kafka.libs/librdkafka-*.so*``, with an rpath to it), so nothing beyond the wheel is needed
at run time and no rdkafka.h at build time. Not product code: what it handles is in the C file's
comments and docs/benchmarks/readers.md.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import confluent_kafka
import pyarrow as pa

from fanout_sink.errors import SourceReadError
from fanout_sink.kafka.range_reader import (
    CONSUME_WAIT_S,
    DEFAULT_STALL_TIMEOUT_S,
    RANGE_CONSUMER,
    RAW_RECORD_SCHEMA,
    fetch_defaults,
)

SOURCE = Path(__file__).with_name("_rangeread.c")
_HEADERS = RAW_RECORD_SCHEMA.field("headers").type
_HEADER_ENTRY = _HEADERS.value_type


def bundled_librdkafka() -> Path:
    """The librdkafka shared object that confluent-kafka's wheel carries."""
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka-*.so*"))
    if not found:
        raise RuntimeError(f"no librdkafka-*.so* in {libs} (confluent-kafka not from a manylinux wheel?)")
    return found[0]


def build(out_dir: Path | None = None) -> Path:
    """Compile ``_rangeread.c`` into ``out_dir`` (default: next to it, under ``build/``), unless a
    build newer than the source is there; the extension's path."""
    out_dir = out_dir or SOURCE.parent / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = bundled_librdkafka()
    target = out_dir / ("_rangeread" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    if target.exists() and target.stat().st_mtime >= SOURCE.stat().st_mtime:
        return target
    command = [
        "cc",
        "-O2",
        "-shared",
        "-fPIC",
        "-Wall",
        f"-I{sysconfig.get_paths()['include']}",
        str(SOURCE),
        "-o",
        str(target),
        f"-L{lib.parent}",
        f"-l:{lib.name}",
        f"-Wl,-rpath,{lib.parent}",
    ]
    subprocess.run(command, check=True)
    return target


def load() -> ModuleType:
    """The built extension, imported (built first if needed)."""
    if "_rangeread" in sys.modules:
        return sys.modules["_rangeread"]
    spec = importlib.util.spec_from_file_location("_rangeread", build())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_rangeread"] = module
    return module


def _conf_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class NativeRangeReader:
    """``RangeReader.read_chunks`` for one range assigned alone (no :meth:`assigned` groups, no
    fetch ahead), over the C extension. ``conf`` is the ``kafka:`` section's librdkafka properties
    (plain values, no callbacks)."""

    def __init__(
        self, conf: Mapping[str, Any], group: str, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    ) -> None:
        self.group = group
        self.stall_timeout_s = stall_timeout_s
        settings = {**fetch_defaults(conf), **conf, "group.id": group, **RANGE_CONSUMER}
        self._reader = load().Reader({k: _conf_value(v) for k, v in settings.items()})

    def read_chunks(
        self, topic: str, partition: int, start: int, end: int, max_records: int | None = None
    ) -> Iterator[pa.Table]:
        """The visible records of ``[start, end)`` in tables of at most ``max_records``."""
        if start >= end:
            return
        limit = max_records if max_records is not None else end - start
        module = load()
        self._reader.assign(topic, partition, start)
        try:
            while True:
                try:
                    chunk = self._reader.read(end, limit, int(CONSUME_WAIT_S * 1000), self.stall_timeout_s)
                except module.ReadError as error:
                    raise SourceReadError(
                        f"reading source {topic}[{partition}] [{start}, {end}) failed: {error}"
                    ) from error
                if chunk[0]:
                    yield pa.Table.from_batches([_record_batch(topic, partition, chunk)], RAW_RECORD_SCHEMA)
                if chunk[1] >= end:
                    return
        finally:
            self._reader.unassign()

    def close(self) -> None:
        self._reader.close()


def _binary(kind: pa.DataType, count: int, column: tuple[Any, ...]) -> pa.Array:
    valid, nulls, offsets, data = column
    buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, count, buffers, null_count=nulls)


def _record_batch(topic: str, partition: int, chunk: tuple[Any, ...]) -> pa.RecordBatch:
    count, _position, key, value, offsets, stamps, kinds, headers = chunk
    return pa.RecordBatch.from_arrays(
        [
            _binary(pa.binary(), count, key),
            _binary(pa.binary(), count, value),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)], null_count=0),
            pa.Array.from_buffers(
                pa.timestamp("us", tz="UTC"), count, [None, pa.py_buffer(stamps)], null_count=0
            ),
            pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(kinds)], null_count=0),
            _headers(count, headers),
        ],
        schema=RAW_RECORD_SCHEMA,
    )


def _headers(count: int, headers: tuple[Any, ...] | None) -> pa.Array:
    """Null where a record has no headers (as ``RangeReader``); key/value structs else."""
    if headers is None:
        return pa.nulls(count, _HEADERS)
    valid, nulls, offsets, name_offsets, names, value_valid, value_nulls, value_offsets, values = headers
    entries = len(name_offsets) // 4 - 1
    keys = _binary(pa.string(), entries, (None, 0, name_offsets, names))
    vals = _binary(pa.binary(), entries, (value_valid, value_nulls, value_offsets, values))
    struct = pa.StructArray.from_arrays([keys, vals], fields=list(_HEADER_ENTRY))
    buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets)]
    return pa.Array.from_buffers(_HEADERS, count, buffers, null_count=nulls, children=[struct])
