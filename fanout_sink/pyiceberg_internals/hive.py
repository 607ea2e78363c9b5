"""``ThreadSafeHiveCatalog``: PyIceberg's Hive catalog with one thrift connection per thread.

``py-catalog-impl`` selects it by class path (``fanout_sink.catalog.HIVE_CATALOG_IMPL``); it is made on
first use, so that ``thrift`` is imported only by a Hive sink. What it reaches into:
``pyiceberg.catalog.hive.HiveCatalog``, subclassed by ``ThreadSafeHiveCatalog``, replacing the private
``_client`` attribute by one thrift client per thread and calling the private ``_create_hive_client``.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from pyiceberg.catalog import Catalog


def __getattr__(name: str) -> Any:
    """``ThreadSafeHiveCatalog`` is made on first use: PyIceberg's Hive module needs ``thrift``, which
    no other catalog's processes should import."""
    if name == "ThreadSafeHiveCatalog":
        return _thread_safe_hive_catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _thread_safe_hive_catalog() -> type[Catalog]:
    from pyiceberg.catalog.hive import HiveCatalog

    # thrift logs "Could not connect to any of [...]" at ERROR and then raises it: the raised one is
    # reported (preflight, status), so each failed connection was printed twice.
    logging.getLogger("thrift.transport.TSocket").setLevel(logging.CRITICAL)

    class ThreadSafeHiveCatalog(HiveCatalog):
        """PyIceberg's HiveCatalog keeps one thrift connection and opens and closes it around every
        call, so calls from two threads close each other's socket: the coordinator's commit threads
        failed with "Transport not open" (after the metastore lock, before the unlock). One client,
        hence one connection, per thread."""

        def __init__(self, name: str, **properties: str) -> None:
            self._clients = threading.local()
            super().__init__(name, **properties)

        @property  # type: ignore[override]
        def _client(self) -> Any:
            client = getattr(self._clients, "client", None)
            if client is None:
                client = self._clients.client = self._create_hive_client(self.properties)
            return client

        @_client.setter
        def _client(self, client: Any) -> None:
            self._clients.client = client

    return ThreadSafeHiveCatalog
