"""A Schema Registry that does not know a schema id yet (a lagging follower, a restore in progress)
must not turn good records into dead letters for the life of the worker (issue 24 item 6)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from support.registry import Registry, wire

from fanout_sink.transform.formats import registry as registry_format
from fanout_sink.transform.formats.avro import AvroReader
from fanout_sink.transform.formats.registry import RegistryDecoder

SCHEMA: dict[str, Any] = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
SCHEMA_ID = 42


def _value(i: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), {"id": i})
    return wire(SCHEMA_ID, out.getvalue())


@pytest.fixture
def registry() -> Iterator[Registry]:
    served = Registry()
    yield served
    served.close()


def test_a_schema_id_the_registry_serves_later_is_read_once_it_does(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_format, "UNKNOWN_ID_WAIT_S", 0.3)
    monkeypatch.setattr(registry_format, "UNKNOWN_ID_TTL_S", 0.5)
    decoder = RegistryDecoder(AvroReader, {"url": registry.url})

    first = decoder(pa.array([_value(1)], pa.binary()))
    assert [reason.split(";")[0] for _, reason in first.failures] == [
        f"unknown schema id {SCHEMA_ID} in the Schema Registry"
    ]
    registry.publish(SCHEMA_ID, SCHEMA)
    time.sleep(0.6)  # the 404 is remembered briefly, not for the life of the worker

    later = decoder(pa.array([_value(2), _value(3)], pa.binary()))
    assert later.failures == []
    assert later.records.column("id").to_pylist() == [2, 3]


def test_a_lagging_follower_is_waited_for_instead_of_dead_lettering(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_format, "UNKNOWN_ID_WAIT_S", 5.0)  # the production wait
    registry.publish(SCHEMA_ID, SCHEMA)
    registry.lag(SCHEMA_ID, misses=3)
    decoder = RegistryDecoder(AvroReader, {"url": registry.url})

    decoded = decoder(pa.array([_value(7)], pa.binary()))

    assert decoded.failures == []
    assert decoded.records.column("id").to_pylist() == [7]
    assert sum(f"/schemas/ids/{SCHEMA_ID}" in r for r in registry.requests) == 4
