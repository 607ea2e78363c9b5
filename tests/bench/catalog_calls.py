"""Counts a catalog's calls per method, so that a round's catalog cost is measured by what it asks,
not by wall time (which a shared machine's load blurs).

The counting wrappers are set on the catalog object itself, not on a proxy: a ``Table`` keeps the
catalog it was loaded by and commits through it, so a proxy would miss every commit.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog

COUNTED = (
    "load_table",
    "commit_table",
    "table_exists",
    "list_tables",
    "list_namespaces",
    "create_table",
    "create_namespace_if_not_exists",
    "namespace_exists",
)
"""The calls that reach the catalog's store (one request or query each, or more)."""


class CatalogCalls:
    """Counts ``catalog``'s calls from now on; :meth:`take` returns and resets the counts."""

    def __init__(self, catalog: Catalog) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        for name in COUNTED:
            setattr(catalog, name, self._counting(name, getattr(catalog, name)))

    def _counting(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._counts[name] += 1
            return call(*args, **kwargs)

        return counted

    def take(self) -> Counter[str]:
        """The calls counted since the last ``take`` (and start counting again from zero)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts
