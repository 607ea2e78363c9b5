"""A Schema Registry that does not know a schema id yet (a lagging follower, a restore in progress)
must not turn good records into dead letters (issue 24 item 6), nor hold a slice one wait per
unknown id (issue 33 item 5): an unknown id fails the slice (retried) until
``source.unknown-schema-id-timeout`` has passed since it was first seen, and the ids of one chunk
share one wait budget.

The registry module's clock, its wait policy's too, is a fake one (``registry_clock``,
tests/transform/conftest.py): sleeps advance it at once and are summed, so the tests count the
seconds a decode would wait instead of waiting them; the registry is a real HTTP one."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from support.registry import FakeClock, Registry, wire

from fanout_sink.errors import UnknownSchemaIdError
from fanout_sink.transform.formats import registry as registry_format
from fanout_sink.transform.formats.avro import AvroReader
from fanout_sink.transform.formats.registry import RegistryDecoder
from fanout_sink.transform.formats.unknown_ids import UnknownSchemaIds

SCHEMA: dict[str, Any] = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
SCHEMA_ID = 42
TIMEOUT_S = 300.0
"""``source.unknown-schema-id-timeout``'s default, 5m."""


def _value(i: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), {"id": i})
    return wire(SCHEMA_ID, out.getvalue())


def _id_requests(registry: Registry) -> int:
    return sum("/schemas/ids/" in r for r in registry.requests)


@pytest.fixture
def registry() -> Iterator[Registry]:
    served = Registry()
    yield served
    served.close()


def test_a_lagging_follower_is_waited_for_instead_of_dead_lettering(
    registry: Registry, registry_clock: FakeClock
) -> None:
    registry.publish(SCHEMA_ID, SCHEMA)
    registry.lag(SCHEMA_ID, misses=3)
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)

    decoded = decoder(pa.array([_value(7)], pa.binary()))

    assert decoded.failures == []
    assert decoded.records.column("id").to_pylist() == [7]
    assert _id_requests(registry) == 4
    assert registry_clock.slept < registry_format.UNKNOWN_ID_WAIT_S


def test_many_unknown_ids_in_one_slice_wait_one_budget_in_all(
    registry: Registry, registry_clock: FakeClock
) -> None:
    """Each distinct unknown id used to wait 5 s in turn: 4 junk ids held a batch 18 s, a flood of
    them for hours."""
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)
    junk = pa.array([wire(1000 + i, b"\x02") for i in range(4)], pa.binary())

    with pytest.raises(UnknownSchemaIdError) as raised:
        decoder(junk)

    assert registry_clock.slept <= registry_format.UNKNOWN_ID_WAIT_S
    assert sorted(raised.value.since) == [1000, 1001, 1002, 1003]


def test_a_record_whose_id_is_registered_after_the_first_look_up_is_read_not_dead_lettered(
    registry: Registry, registry_clock: FakeClock
) -> None:
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)

    with pytest.raises(UnknownSchemaIdError, match=rf"schema ids \[{SCHEMA_ID}@"):
        decoder(pa.array([_value(1)], pa.binary()))
    registry_clock.sleep(6)
    registry.publish(SCHEMA_ID, SCHEMA)

    decoded = decoder(pa.array([_value(1)], pa.binary()))
    assert decoded.failures == []
    assert decoded.records.column("id").to_pylist() == [1]


def test_an_id_unknown_for_the_timeout_is_dead_lettered_saying_so_then_read_once_registered(
    registry: Registry, registry_clock: FakeClock
) -> None:
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)
    with pytest.raises(UnknownSchemaIdError):
        decoder(pa.array([_value(1)], pa.binary()))
    registry_clock.sleep(TIMEOUT_S)
    waited = registry_clock.slept

    asked = _id_requests(registry)

    dead = decoder(pa.array([_value(1)], pa.binary()))

    assert (
        registry_clock.slept == waited and _id_requests(registry) == asked + 1
    )  # asked once, not waited for
    [(index, reason)] = dead.failures
    assert index == 0
    assert reason.startswith(f"unknown schema id {SCHEMA_ID} in the Schema Registry for 30")
    assert "longer than source.unknown-schema-id-timeout (300s)" in reason
    registry.publish(SCHEMA_ID, SCHEMA)
    registry_clock.sleep(registry_format.UNKNOWN_ID_TTL_S)  # the final 404 is remembered this long, no longer

    later = decoder(pa.array([_value(2), _value(3)], pa.binary()))
    assert later.failures == []
    assert later.records.column("id").to_pylist() == [2, 3]


def test_the_timeout_runs_from_the_first_sighting_in_any_process(
    registry: Registry, registry_clock: FakeClock
) -> None:
    """The driver hands each attempt's tasks the ids earlier tasks (other Python workers) found
    unknown; a task seeing one for the first time dead-letters it once the timeout has passed."""
    decoder = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)
    decoder.seen_since({SCHEMA_ID: registry_clock.time() - TIMEOUT_S})

    dead = decoder(pa.array([_value(1)], pa.binary()))

    assert [index for index, _ in dead.failures] == [0]
    assert registry_clock.slept == 0
    assert UnknownSchemaIdError.find(str(UnknownSchemaIdError({5: 1.5, 6: 2.25}, 60.0))) == {5: 1.5, 6: 2.25}


def test_an_id_the_registry_served_leaves_the_drivers_record_so_a_later_404_is_waited_for(
    registry: Registry, registry_clock: FakeClock
) -> None:
    """Issue 47 item 3: the driver's record of unknown ids only grew and was handed to every task, so
    once an id had been unknown (and then served), a new Python worker's next 404 for it (a lagging
    follower) counted from the first sighting, long past the timeout: its good values were
    dead-lettered at once. The task that read the id reports it served, and it leaves the record."""
    record = UnknownSchemaIds(TIMEOUT_S)
    worker = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)  # one Python worker
    with pytest.raises(UnknownSchemaIdError) as unknown:
        worker(pa.array([_value(1)], pa.binary()))
    assert record.seen(UnknownSchemaIdError.find(str(unknown.value)))  # the batch is retried
    registry.publish(SCHEMA_ID, SCHEMA)  # learnt after a long while: the id was known once
    registry_clock.sleep(2 * TIMEOUT_S)
    worker.seen_since(record.since)
    assert worker(pa.array([_value(2)], pa.binary())).failures == []
    record.served(worker.served(list(record.since)))  # what the task reports with its slices

    restarted = RegistryDecoder(AvroReader, {"url": registry.url}, TIMEOUT_S)  # a new Python worker
    restarted.seen_since(record.since)
    registry.lag(SCHEMA_ID, misses=1_000)  # a follower that lost the schema for a while

    with pytest.raises(UnknownSchemaIdError):  # retried, not dead-lettered
        restarted(pa.array([_value(3)], pa.binary()))
    registry.lag(SCHEMA_ID, misses=0)
    assert restarted(pa.array([_value(3)], pa.binary())).records.column("id").to_pylist() == [3]
