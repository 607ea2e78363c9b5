"""Apache Iceberg's own REST catalog server on 127.0.0.1: the classes behind the apache/iceberg-rest-fixture
image (``RESTCatalogAdapter`` over a ``JdbcCatalog``, served by Jetty), from Maven Central jars at the
Iceberg version of the Spark runtime, started by the project's launcher (``RestCatalogLauncher.java``,
run from source: no build step).

The catalog's state is a SQLite file in the work dir (kept across a kill and a restart), or a database
of the stack's PostgreSQL (``CatalogDatabase``, the production shape); tables live on an S3 store.
Clients speak plain Iceberg REST at ``http://127.0.0.1:P`` and read and write table files with their own
S3 keys (nothing is vended); the server writes table metadata to the store with the same key pair.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from fanout_sink import jars
from fanout_sink.devtools.stack.object_store import S3Access
from fanout_sink.devtools.stack.service import (
    LOCALHOST,
    CatalogServerState,
    LocalServer,
    http_status,
    java,
    pick_port,
)
from fanout_sink.errors import StackError
from fanout_sink.spark.jvm import LIGHT_JIT

log = logging.getLogger(__name__)

ICEBERG_REST = jars.JarSet("iceberg-rest", "fanout_sink.devtools.stack")
"""Iceberg's REST servlet and catalog, Jetty, the JDBC drivers and S3FileIO (``poms/iceberg-rest.xml``)."""
LAUNCHER = "RestCatalogLauncher.java"
"""The launcher's source, shipped beside this module."""
CATALOG_ENV_PREFIX = "CATALOG_"
"""The launcher turns every ``CATALOG_X`` variable into catalog property ``x`` (the fixture's convention)."""
HEAP_ENV = "FANOUT_SINK_REST_CATALOG_HEAP"
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a commit waits for SQLite's write lock before failing (the driver's default is 3 s)."""


@dataclass(frozen=True)
class CatalogDatabase:
    """A database the server keeps its catalog in, instead of its own SQLite file: a JDBC URL and a
    login (the password goes to the server in its environment, never on the command line)."""

    jdbc_url: str
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class RestCatalogState(CatalogServerState):
    """Where the catalog serves; ``database`` is the JDBC URL of its own state."""

    @property
    def uri(self) -> str:
        """The catalog's ``uri`` property for Iceberg REST clients (no path prefix)."""
        return f"http://127.0.0.1:{self.port}"


class RestCatalog(LocalServer[RestCatalogState]):
    """Iceberg's REST catalog on a ``JdbcCatalog``: namespaces, tables and their commits survive a kill
    and a restart. Tables go to ``s3://<bucket>/<namespace>/<table>`` on ``store``."""

    kind = "rest"
    title = "Iceberg REST catalog"
    state_type = RestCatalogState

    def __init__(
        self,
        work_dir: Path,
        store: S3Access,
        bucket: str,
        port: int | None = None,
        host: str = LOCALHOST,
        database: CatalogDatabase | None = None,
    ) -> None:
        """``database`` None keeps the catalog in ``<work_dir>/catalog.db`` (SQLite)."""
        super().__init__(work_dir, port, host)
        self.store = store
        self.bucket = bucket
        self.database = database

    def _launch(self, previous: RestCatalogState | None) -> RestCatalogState:
        classpath = str(jars.fetch(ICEBERG_REST) / "*")
        port = pick_port(self.requested_port, previous.port if previous else None)
        location = self.store.create_bucket(self.bucket) + "/"
        heap = os.environ.get(HEAP_ENV, "512m")
        pid = self._spawn(
            [java(), f"-Xmx{heap}", LIGHT_JIT, "-cp", classpath, str(Path(__file__).with_name(LAUNCHER))],
            env=self._environment(location, port),
        )
        return RestCatalogState(
            pid=pid, port=port, log_file=str(self.log_file), warehouse_location=location,
            database=self._jdbc_url(),
        )  # fmt: skip

    def _jdbc_url(self) -> str:
        if self.database is not None:
            return self.database.jdbc_url
        return f"jdbc:sqlite:{self.work_dir / 'catalog.db'}?busy_timeout={SQLITE_BUSY_TIMEOUT_MS}"

    def _environment(self, location: str, port: int) -> dict[str, str]:
        """This process's environment without its own ``CATALOG_*`` variables (the catalog is exactly
        what this object says), plus the catalog's settings; secrets stay off the command line."""
        settings = {
            "uri": self._jdbc_url(),
            "warehouse": location,
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": self.store.endpoint,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.store.access_key_id,
            "s3.secret-access-key": self.store.secret_access_key,
            "client.region": self.store.region,
            "rest.host": self.host,
            "rest.port": str(port),
        }
        if self.database is not None:
            settings["jdbc.user"] = self.database.user
            settings["jdbc.password"] = self.database.password
        env = {name: value for name, value in os.environ.items() if not name.startswith(CATALOG_ENV_PREFIX)}
        env.update({catalog_env_name(key): value for key, value in settings.items()})
        return env

    def _ready(self, state: RestCatalogState) -> bool:
        return http_status(f"{state.uri}/v1/config") == 200

    def _diagnose(self, tail: str) -> tuple[str, str]:
        if "jdk.compiler" in tail:
            return (
                "the `java` found is a runtime without a compiler: the launcher runs from its source",
                "install a JDK 17+ (Debian: `apt-get install -y openjdk-17-jdk-headless`), not only a JRE",
            )
        return super()._diagnose(tail)

    def start(self, timeout_s: float = 120.0) -> RestCatalogState:
        began = time.monotonic()
        state = super().start(timeout_s)
        # The figure the switch from Nessie (17-66 s) was made for; the log has the JVM's own count.
        log.info("%s served %s %.1f s after its launch", self.title, state.uri, time.monotonic() - began)
        return state


def catalog_env_name(key: str) -> str:
    """The launcher's variable for catalog property ``key``: the inverse of the fixture's mapping
    (``s3.access-key-id`` -> ``CATALOG_S3_ACCESS__KEY__ID``). Keys with ``_`` have no such name."""
    if "_" in key:
        raise StackError(
            f"the catalog property {key!r} cannot be passed as a CATALOG_* variable (it holds '_')",
            "pass it inside the JDBC URL or choose the property's dashed spelling",
        )
    return CATALOG_ENV_PREFIX + key.replace("-", "__").replace(".", "_").upper()
