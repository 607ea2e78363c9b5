"""The bad-input corpus through the real slice processor: one dead letter per bad record, good
records around it untouched; under ``errors.tolerance: none`` the first bad record stops the slice."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from support.bad_records import (
    CLICKS,
    ORDERS,
    REPO,
    BadRecord,
    assert_dead_letter,
    good_record,
    interleaved,
    sink_settings,
)
from support.raw_slices import make_raw_slice
from support.registry import FakeClock, Registry, wire

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import RecordError
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor
from fanout_sink.transform.records import DeadLetter, RoutedSlice

TOPIC, PARTITION, START = "events", 3, 100


def _config(catalog_settings: CatalogSettings, **overrides: Any) -> SinkConfig:
    data = {"name": "corpus", "catalog": catalog_settings.model_dump(), **sink_settings(**overrides)}
    return parse_config(data, "corpus", base_dir=REPO)


def _slice(entries: list[BadRecord | int], start: int = START) -> pa.Table:
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    headers: list[list[tuple[str, bytes]]] = []
    for entry in entries:
        if isinstance(entry, BadRecord):
            values.append(entry.value)
            keys.append(entry.key)
            headers.append(list(entry.headers))
        else:
            values.append(good_record(entry)[0])
            keys.append(f"good-{entry}".encode())
            headers.append([])
    return make_raw_slice(
        values, topic=TOPIC, partition=PARTITION, start_offset=start, keys=keys, headers=headers
    )


def _check_outcome(out: RoutedSlice, entries: list[BadRecord | int], start: int) -> None:
    bad = {start + i: e for i, e in enumerate(entries) if isinstance(e, BadRecord)}
    by_offset: dict[int, list[DeadLetter]] = {}
    for letter in out.dead_letters:
        by_offset.setdefault(int(deadletter.header(letter, deadletter.SOURCE_OFFSET) or -1), []).append(
            letter
        )
    assert set(by_offset) == set(bad), "dead letters only for bad records"
    for offset, case in bad.items():
        (letter,) = by_offset[offset]
        assert_dead_letter(letter, case, TOPIC, PARTITION, offset)
    goods = [(*good_record(e), e) for e in entries if isinstance(e, int)]
    for table in (ORDERS, CLICKS):
        expected = sorted(i for _, t, i in goods if t == table)
        got = out.tables[table].rows.column("id").to_pylist() if table in out.tables else []
        assert sorted(got) == expected, table
    assert out.filtered == sum(1 for _, t, _ in goods if t is None)


@pytest.mark.parametrize("one_slice", [True, False], ids=["one-slice", "slice-per-case"])
def test_every_bad_record_becomes_one_dead_letter(
    catalog_settings: CatalogSettings, catalog: Any, one_slice: bool
) -> None:
    """All together (Arrow's batch parse fails, values are isolated) and each case alone between two
    good records (the batch paths see the bad value next to good ones)."""
    process = build_processor(_config(catalog_settings), catalog)
    entries = interleaved()
    if one_slice:
        _check_outcome(process(_slice(entries)), entries, START)
        assert process.last_stats.reconciles()
        return
    for i in range(0, len(entries) - 1, 2):
        part = entries[i : i + 3]
        _check_outcome(process(_slice(part, START + i)), part, START + i)
        assert process.last_stats.reconciles()


def test_tolerance_none_stops_at_each_bad_record(catalog_settings: CatalogSettings, catalog: Any) -> None:
    """Every corpus error names its own record; tombstones are skipped by policy, not errors."""
    config = _config(
        catalog_settings,
        source={"topics": ["events"], "tombstones": "skip"},
        errors={"tolerance": "none"},
        **{"dead-letter": None},
    )
    process = build_processor(config, catalog)
    entries = interleaved()
    first = next(i for i, e in enumerate(entries) if isinstance(e, BadRecord) and e.error)
    with pytest.raises(RecordError) as info:
        process(_slice(entries))
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, START + first)
    for i in range(1, len(entries), 2):
        case = entries[i]
        assert isinstance(case, BadRecord)
        part = entries[i - 1 : i + 2]
        if not case.error:
            out = process(_slice(part))
            pings = sum(1 for e in part if isinstance(e, int) and good_record(e)[1] is None)
            assert (out.dead_letters, out.filtered) == ([], 1 + pings), "skipped by policy"
            continue
        with pytest.raises(RecordError) as info:
            process(_slice(part, START + i - 1))
        error = info.value
        assert (error.offset, error.stage) == (START + i, case.stage), case.name
        assert case.reason in error.reason and f"{TOPIC}[{PARTITION}]@{START + i}" in str(error), case.name


AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "type", "type": "string"},
        {"name": "id", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
KNOWN_ID, UNKNOWN_ID = 7, 99


def _avro_order(i: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), {"type": "order", "id": i, "ts": 0})
    return wire(KNOWN_ID, out.getvalue())


AVRO_CASES = (
    BadRecord("unknown schema id", wire(UNKNOWN_ID, _avro_order(1)[5:]), "decode", "unknown schema id 99"),
    BadRecord("magic byte 1", b"\x01" + _avro_order(1)[1:], "decode", "not Confluent wire format"),
    BadRecord("shorter than the header", b"\x00\x00\x07", "decode", "not Confluent wire format"),
    BadRecord("truncated body", _avro_order(1)[:-3], "decode", "invalid Avro for the writer schema"),
    BadRecord("trailing bytes", _avro_order(1) + b"\x00\x00", "decode", "invalid Avro: 2 trailing bytes"),
    BadRecord("JSON sent to an Avro topic", good_record(0)[0], "decode", "not Confluent wire format"),
)


@pytest.fixture
def registry() -> Iterator[Registry]:
    served = Registry({KNOWN_ID: AVRO_SCHEMA})
    yield served
    served.close()


def test_confluent_avro_unknown_schema_ids_and_broken_frames(
    catalog_settings: CatalogSettings, catalog: Any, registry: Registry, registry_clock: FakeClock
) -> None:
    """A real HTTP Schema Registry answers 404 for the unknown id; good records keep flowing."""
    source = {
        "topics": ["events"],
        "format": "confluent-avro",
        "schema-registry": {"url": registry.url},
        "unknown-schema-id-timeout": "0s",  # dead-lettered at once (tests/transform/test_registry_lag.py)
    }
    process = build_processor(_config(catalog_settings, source=source), catalog)
    values: list[bytes | None] = []
    for i, case in enumerate(AVRO_CASES):
        values += [_avro_order(i), case.value]
    out = process(make_raw_slice(values, topic=TOPIC, partition=PARTITION, start_offset=START))
    assert out.tables[ORDERS].rows.column("id").to_pylist() == list(range(len(AVRO_CASES)))
    assert len(out.dead_letters) == len(AVRO_CASES)
    for i, (letter, case) in enumerate(zip(out.dead_letters, AVRO_CASES, strict=True)):
        assert_dead_letter(letter, case, TOPIC, PARTITION, START + 2 * i + 1)
    assert f"/schemas/ids/{UNKNOWN_ID}" in " ".join(registry.requests)


def test_record_error_is_recovered_from_sparks_text() -> None:
    """Raised on an executor, the error reaches the driver as text inside Spark's own exception."""
    error = RecordError("shop-events.v1", 1, 41, "convert", "column 'id': cannot convert 'x' (table a.b)")
    spark_text = (
        "Job aborted.\nTraceback (most recent call last):\n  ...\n"
        f"fanout_sink.errors.RecordError: {error}\n\tat org.apache.spark..."
    )
    found = RecordError.find(spark_text)
    assert found is not None and str(found) == str(error)
    assert (found.topic, found.partition, found.offset, found.stage) == ("shop-events.v1", 1, 41, "convert")
    assert RecordError.find("Job aborted: java.lang.OutOfMemoryError") is None
