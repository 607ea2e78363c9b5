"""Counts a catalog's calls per method, so that a round's catalog cost is measured by what it asks,
not by wall time (which a shared machine's load blurs).

The counting wrappers are set on the catalog object itself, not on a proxy: a ``Table`` keeps the
catalog it was loaded by and commits through it, so a proxy would miss every commit. A SQL
catalog's table commits are counted where they reach its database instead (one ``UPDATE`` of the
table's row each): the coordinator commits through a view of the catalog that reuses the metadata it
loaded (``pyiceberg_internals.transactions.no_retry_transaction``), not through the catalog object's method.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog
from sqlalchemy import Engine, event

COUNTED = (
    "load_table",
    "table_exists",
    "list_tables",
    "list_namespaces",
    "create_table",
    "create_namespace_if_not_exists",
    "namespace_exists",
)
"""The calls that reach the catalog's store (one request or query each, or more)."""
COMMIT_STATEMENT = "UPDATE iceberg_tables "
"""How a SQL catalog's commit of an existing table starts (PyIceberg's ``SqlCatalog.commit_table``)."""


class CatalogCalls:
    """Counts ``catalog``'s calls from now on; :meth:`take` returns and resets the counts."""

    def __init__(self, catalog: Catalog) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        for name in COUNTED:
            setattr(catalog, name, self._counting(name, getattr(catalog, name)))
        engine = getattr(catalog, "engine", None)
        if isinstance(engine, Engine):
            event.listen(engine, "before_cursor_execute", self._statement)
        else:
            catalog.commit_table = self._counting("commit_table", catalog.commit_table)  # type: ignore[method-assign]

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().startswith(COMMIT_STATEMENT):
            with self._lock:
                self._counts["commit_table"] += 1

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
