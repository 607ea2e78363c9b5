"""Fixtures of the transform tests."""

from __future__ import annotations

import pytest

from fanout_sink.transform.formats import registry


@pytest.fixture(autouse=True)
def brief_unknown_schema_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that dead-letter unknown schema ids do not wait the production 5 s for a lagging
    registry follower (``tests/transform/test_registry_lag.py`` sets the waits it tests)."""
    monkeypatch.setattr(registry, "UNKNOWN_ID_WAIT_S", 0.2)
