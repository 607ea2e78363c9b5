"""The stack as long-lived local services for people: ``fanout-sink stack up | down | status | serve``.

State lives in one folder (default ``<cache>/stack``): the broker's at its top, every other server's
in a sub-folder named after it. So ``up`` twice reuses what runs, ``down`` finds it from any shell,
and ``serve <name>`` runs one server in the foreground (docker/ runs exactly that).

``SERVICES`` is the registry: a server joins ``up --with``, ``serve``, ``down`` and ``status`` with
one entry.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import (
    BrokerState,
    KafkaBroker,
    is_running,
    load_state,
    port_is_free,
    stop_pid,
)
from fanout_sink.devtools.stack.hive_metastore import HiveMetastore
from fanout_sink.devtools.stack.object_store import ObjectStore, S3Access
from fanout_sink.devtools.stack.postgres import PostgresServer, create_database
from fanout_sink.devtools.stack.rest_catalog import CatalogDatabase, RestCatalog
from fanout_sink.devtools.stack.service import LOCALHOST, LocalServer, Startable
from fanout_sink.devtools.stack.spark_cluster import SparkMaster, SparkWorker, master_url_for
from fanout_sink.errors import StackError
from fanout_sink.processes import pid_alive

DEFAULT_PORT = 9092
WAREHOUSE_BUCKET = "warehouse"
"""The bucket the stack's REST catalog keeps its tables in."""
REST_CATALOG_DB_ENV = "FANOUT_SINK_REST_CATALOG_DB"
"""``postgres``: the REST catalog keeps its state in the stack's PostgreSQL (else a SQLite file)."""
REST_CATALOG_DATABASE = "rest_catalog"
"""The REST catalog's own database on the stack's PostgreSQL (``iceberg`` is the SQL catalog's)."""


def default_dir() -> Path:
    return jars.cache_dir() / "stack"


@dataclass(frozen=True)
class Service:
    """One server of the stack: how to build it for a stack folder, a port and a listen address, and
    what a client needs from its state (``client_settings``, shown by ``up`` and ``status``)."""

    title: str
    build: Callable[[Path, int | None, str], Startable]
    client_settings: Callable[[Any], dict[str, str]]
    credentials: bool = False
    """Its state holds secrets a client needs (keys, a password): ``up`` then says where to read them."""


def _s3_access(stack_dir: Path) -> S3Access:
    """The store the REST catalog writes to: the stack's own S3Proxy, else ``FANOUT_SINK_S3_*``."""
    state = ObjectStore(stack_dir / "s3").running()
    if state is not None:
        return state.access
    access = S3Access.from_env()
    if access is None:
        raise StackError(
            "the REST catalog needs an S3 store and none runs in this stack folder",
            "start one first (`fanout-sink stack up --with s3,rest`), or set FANOUT_SINK_S3_ENDPOINT, "
            "FANOUT_SINK_S3_ACCESS_KEY_ID and FANOUT_SINK_S3_SECRET_ACCESS_KEY",
        )
    return access


def _rest_catalog_database(stack_dir: Path) -> CatalogDatabase | None:
    """Where the REST catalog keeps its state: None (its own SQLite file) unless
    ``FANOUT_SINK_REST_CATALOG_DB=postgres`` asks for the stack's PostgreSQL, the production shape."""
    wanted = os.environ.get(REST_CATALOG_DB_ENV, "sqlite")
    if wanted == "sqlite":
        return None
    if wanted != "postgres":
        raise StackError(
            f"{REST_CATALOG_DB_ENV}={wanted!r} names no database the REST catalog can use",
            "set it to `sqlite` (the default) or `postgres`",
        )
    state = PostgresServer(stack_dir / "postgres").running()
    if state is None:
        raise StackError(
            f"{REST_CATALOG_DB_ENV}=postgres, but no PostgreSQL runs in this stack folder",
            "start it with the catalog (`fanout-sink stack up --with s3,postgres,rest`)",
        )
    database = create_database(state, REST_CATALOG_DATABASE)
    return CatalogDatabase(database.jdbc_url, database.user, database.password)


SERVICES: Mapping[str, Service] = {
    "broker": Service(
        "Kafka broker",
        lambda d, port, host: KafkaBroker(d, port=port, host=host),
        lambda s: {"bootstrap.servers": s.bootstrap_servers},
    ),
    "s3": Service(
        "S3 object store (S3Proxy)",
        lambda d, port, host: ObjectStore(d / "s3", port, host),
        lambda s: {"s3.endpoint": s.endpoint, "s3.region": s.region},
        credentials=True,
    ),
    "postgres": Service(
        "PostgreSQL",
        lambda d, port, host: PostgresServer(d / "postgres", port, host),
        lambda s: {"type": "sql", "uri": s.sqlalchemy_uri.replace(f":{s.password}@", ":***@")},
        credentials=True,
    ),
    "rest": Service(
        "Iceberg REST catalog",
        lambda d, port, host: RestCatalog(
            d / "rest", _s3_access(d), WAREHOUSE_BUCKET, port, host, _rest_catalog_database(d)
        ),
        lambda s: {"type": "rest", "uri": s.uri},
        credentials=True,  # the store's keys, which a client of its tables needs
    ),
    "hive-metastore": Service(
        "Hive Metastore",
        lambda d, port, host: HiveMetastore(d / "hive-metastore", port, host),
        lambda s: {"type": "hive", "uri": s.uri, "warehouse": s.warehouse_location},
    ),
    "spark-master": Service(
        "Spark standalone master",
        lambda d, port, host: SparkMaster(d / "spark-master", port, host),
        lambda s: {"spark.master": s.master_url},
    ),
    "spark-worker": Service(
        "Spark standalone worker",
        lambda d, port, host: SparkWorker(d / "spark-worker", master_url_for(d), port, host),
        lambda s: {"spark.master": s.master_url},
    ),
}
"""Every server, in start order (the REST catalog needs the store and, when asked, PostgreSQL; a Spark
worker its master)."""
EXTRAS = tuple(name for name in SERVICES if name != "broker")


def up(work_dir: Path, port: int | None = None) -> tuple[BrokerState, bool]:
    """The running broker's state and whether this call started it (False: it was already up)."""
    state = load_state(work_dir)
    if state is not None and is_running(state):
        return state, False
    if port is None and state is None and port_is_free(DEFAULT_PORT):
        port = DEFAULT_PORT
    return KafkaBroker(work_dir, port=port).start(), True


def up_extras(work_dir: Path, names: Iterable[str]) -> list[tuple[str, Any, bool]]:
    """Start the named servers beside the broker (in registry order), reusing running ones:
    (name, state, started by this call) for each."""
    wanted = set(names)
    results = []
    for name in EXTRAS:
        if name not in wanted:
            continue
        server = SERVICES[name].build(work_dir, None, LOCALHOST)
        assert isinstance(server, LocalServer)
        running = server.running()
        if running is not None:
            results.append((name, running, False))
        else:
            results.append((name, server.start(timeout_s=300), True))
    return results


def down(work_dir: Path, names: Iterable[str] | None = None) -> dict[str, bool]:
    """Stop the named servers of the stack (default: every one; extras first in reverse start order,
    the broker last): for each, whether it was running. Data stays for the next ``up``."""
    wanted = set(SERVICES if names is None else names)
    stopped: dict[str, bool] = {}
    for name in reversed(EXTRAS):
        if name not in wanted:
            continue
        server = _local(work_dir, name)
        saved = server.load_state()
        stopped[name] = saved is not None and pid_alive(saved.pid)
        if stopped[name]:
            server.state = saved
            server.stop()
    if "broker" in wanted:
        state = load_state(work_dir)
        stopped["broker"] = state is not None and pid_alive(state.pid)
        if state is not None:
            stop_pid(state.pid)
    return stopped


def _local(work_dir: Path, name: str) -> LocalServer[Any]:
    """A handle on an extra server's folder, to read its state or stop it (never started from here)."""
    folder = work_dir / name
    if name == "rest":
        return RestCatalog(folder, S3Access("", "", ""), WAREHOUSE_BUCKET)
    if name == "spark-worker":
        return SparkWorker(folder, master_url="")
    server = SERVICES[name].build(work_dir, None, LOCALHOST)
    assert isinstance(server, LocalServer)
    return server


def saved_state(work_dir: Path, name: str) -> Any:
    """The last state an extra server of this stack saved (None if it never started)."""
    return _local(work_dir, name).load_state()


def status(work_dir: Path) -> dict[str, Any]:
    """The broker's report at the top (as before), the others under ``services`` by name, each with
    ``running`` and the full state (credentials included: this is how scripts pick them up)."""
    state = load_state(work_dir)
    running = state is not None and is_running(state)
    report: dict[str, Any] = {"running": running, "dir": str(work_dir)}
    if state is not None:
        report.update(asdict(state))
        report["bootstrap.servers"] = state.bootstrap_servers
    services = {}
    for name in EXTRAS:
        server = _local(work_dir, name)
        saved = server.load_state()
        if saved is not None:
            live = server.running() is not None
            services[name] = {"running": live, **asdict(saved), **SERVICES[name].client_settings(saved)}
    if services:
        report["services"] = services
    return report
