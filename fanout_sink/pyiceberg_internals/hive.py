"""``ThreadSafeHiveCatalog``: PyIceberg's Hive catalog with one thrift connection per thread, which
creates a namespace under the metastore's lock on it.

``py-catalog-impl`` selects it by class path (``fanout_sink.catalog.HIVE_CATALOG_IMPL``); it is made on
first use, so that ``thrift`` is imported only by a Hive sink. What it reaches into:
``pyiceberg.catalog.hive.HiveCatalog``, subclassed by ``ThreadSafeHiveCatalog``, replacing the private
``_client`` attribute by one thrift client per thread and calling the private ``_create_hive_client``;
the metastore's thrift types (``hive_metastore.ttypes``, shipped with PyIceberg) for its lock calls.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from fanout_sink.errors import TableError
from fanout_sink.retries import Retry

NAMESPACE_LOCK_WAIT = Retry(deadline_s=60.0, backoff_s=0.02, multiplier=2.0, max_backoff_s=0.5, jitter=0.5)
"""How a namespace create waits for another client's lock on that namespace: another worker holds it
for one create (milliseconds), so it is checked again after 0.02 s, doubling to 0.5 s, for 60 s."""


def __getattr__(name: str) -> Any:
    """``ThreadSafeHiveCatalog`` is made on first use: PyIceberg's Hive module needs ``thrift``, which
    no other catalog's processes should import."""
    if name == "ThreadSafeHiveCatalog":
        return _thread_safe_hive_catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _thread_safe_hive_catalog() -> type[Catalog]:
    from hive_metastore.ttypes import (
        CheckLockRequest,
        LockComponent,
        LockLevel,
        LockRequest,
        LockState,
        LockType,
        UnlockRequest,
    )
    from pyiceberg.catalog.hive import HiveCatalog

    # thrift logs "Could not connect to any of [...]" at ERROR and then raises it: the raised one is
    # reported (preflight, status), so each failed connection was printed twice.
    logging.getLogger("thrift.transport.TSocket").setLevel(logging.CRITICAL)

    class ThreadSafeHiveCatalog(HiveCatalog):
        """PyIceberg's HiveCatalog keeps one thrift connection and opens and closes it around every
        call, so calls from two threads close each other's socket: the coordinator's commit threads
        failed with "Transport not open" (after the metastore lock, before the unlock). One client,
        hence one connection, per thread. A namespace is created under the metastore's lock on it
        (:meth:`create_namespace`)."""

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

        def create_namespace(self, namespace: str | Identifier, properties: Properties = EMPTY_DICT) -> None:
            """Create the namespace (a metastore database) only if it is still missing under the
            metastore's exclusive lock on it: of workers creating one namespace at once, one sends
            the create and the others find the namespace.

            Hive's metastore makes a database's folder when it finds none and deletes it, recursively,
            when the create then fails (Hive 3.1's ``HMSHandler.create_database_core``: ``madeDir``,
            ``wh.deleteDir(dbPath, true, db)`` in its ``finally``). Two creates at once both found no
            folder; the one whose insert lost (a unique-key violation) deleted the folder the other
            worker was already writing its new table's first metadata file into: the table's pointer
            named a file that was gone, and every load of it failed. A create by a client that takes
            no lock (another tool) at that moment is still exposed."""
            database = self.identifier_to_database(namespace)
            if self.namespace_exists(database):  # the common case, no lock: a table of a known namespace
                raise NamespaceAlreadyExistsError(f"Database {database} already exists")
            with self.namespace_lock(database):
                if self.namespace_exists(database):
                    raise NamespaceAlreadyExistsError(f"Database {database} already exists")
                super().create_namespace(namespace, properties)

        @contextlib.contextmanager
        def namespace_lock(self, database: str) -> Iterator[None]:
            """Hold the metastore's exclusive lock on ``database`` (granted for a database that does not
            exist yet as well: the lock table names it, nothing checks it); wait for another client's
            as :data:`NAMESPACE_LOCK_WAIT` says."""
            component = LockComponent(
                level=LockLevel.DB, type=LockType.EXCLUSIVE, dbname=database, isTransactional=True
            )
            request = LockRequest(
                component=[component], user=getpass.getuser(), hostname=socket.gethostname()
            )
            with self._client as client:
                response = client.lock(request)
                tries = NAMESPACE_LOCK_WAIT.start()
                while response.state == LockState.WAITING and tries.again():
                    response = client.check_lock(CheckLockRequest(lockid=response.lockid))
                if response.state == LockState.WAITING:  # not left queued, ahead of the next creator
                    client.unlock(UnlockRequest(lockid=response.lockid))
            if response.state != LockState.ACQUIRED:
                raise TableError(
                    f"namespace {database}: the metastore did not grant its lock on the namespace in "
                    f"{NAMESPACE_LOCK_WAIT.deadline_s:.0f} s (lock state {response.state}): another "
                    "client holds it; find it with SHOW LOCKS in Hive, and retry once it is released"
                )
            try:
                yield
            finally:
                with self._client as client:
                    client.unlock(UnlockRequest(lockid=response.lockid))

    return ThreadSafeHiveCatalog
