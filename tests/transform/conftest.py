"""The transform tests' Schema Registry clock."""

from __future__ import annotations

import dataclasses

import pytest
from support.registry import FakeClock

from fanout_sink.transform.formats import registry as registry_format


@pytest.fixture
def registry_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The registry module's clock, its unknown-id wait's too, on a :class:`FakeClock`. A decode that
    meets an id the registry answers 404 waits up to ``UNKNOWN_ID_WAIT_S`` (5 s) for it, which a test
    on a real clock waits out; on this one the wait runs in full, instantly, and is counted."""
    fake = FakeClock()
    monkeypatch.setattr(registry_format, "time", fake)
    waits = dataclasses.replace(registry_format.UNKNOWN_ID_WAIT, clock=fake.time, sleep=fake.sleep)
    monkeypatch.setattr(registry_format, "UNKNOWN_ID_WAIT", waits)
    return fake
