"""Opt-in markers: tests that run only when ``-m`` names their marker, never in the README's test
command unless its rule asks (its tiers and lanes select with expressions that do not name them).

They take what no run of the suite should pay for unasked: ``docker`` builds docker/'s image (a Debian
base by debootstrap, podman, downloads from PyPI, Maven Central and Debian: minutes and gigabytes), and
is run when docker/ changes: ``.venv/bin/python -m pytest -m docker tests/devtools/test_docker_image.py``.
``bench`` is a benchmark harness's smoke run (its systems end to end at a small size: ten minutes of
the 2-core machine together): it tests the benchmark, not the product, and runs as the bench tier
(``python3 -m fanout_sink.bootstrap test --tier bench``), which the default test command adds when
``tests/bench`` changed since the smoke runs last passed (``fanout_sink/bootstrap.py``,
``bench_changed``).
"""

from __future__ import annotations

import re

import pytest

OPT_IN = ("docker", "bench")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect each opt-in marker's tests unless the ``-m`` expression names the marker."""
    expression = str(config.option.markexpr or "")
    for name in OPT_IN:
        if re.search(rf"\b{name}\b", expression):
            continue
        unasked = [item for item in items if item.get_closest_marker(name) is not None]
        if unasked:
            config.hook.pytest_deselected(items=unasked)
            items[:] = [item for item in items if item.get_closest_marker(name) is None]
