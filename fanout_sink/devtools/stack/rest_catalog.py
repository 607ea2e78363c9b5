"""An Iceberg REST catalog that people run in production: Project Nessie's server (one Quarkus jar from
Maven Central) on 127.0.0.1, its catalog state in RocksDB under the work dir, tables on an S3 store.

Clients speak plain Iceberg REST at ``http://127.0.0.1:P/iceberg`` and read and write table files with
their own S3 keys: Nessie's request signing is off, because PyIceberg's pyarrow FileIO cannot sign
through a catalog. Nessie itself writes table metadata to the store with the same key pair.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fanout_sink import jars
from fanout_sink.devtools.stack.object_store import S3Access
from fanout_sink.devtools.stack.service import (
    LOCALHOST,
    LocalServer,
    http_status,
    java,
    java_major,
    pick_port,
    single_jar,
)
from fanout_sink.errors import StackError
from fanout_sink.spark.jvm import LIGHT_JIT

NESSIE = jars.JarSet("nessie", "fanout_sink.devtools.stack")
"""Nessie's Quarkus runner jar (``poms/nessie.xml``)."""
NESSIE_JAVA = 21
"""Nessie 0.99's classes are built for Java 21 (class file version 65)."""
JVM_SIGTERM_EXIT = 143
"""What a JVM exits with after its shutdown hooks ran on SIGTERM (128 + 15)."""
WAREHOUSE = "warehouse"
"""The name of Nessie's one warehouse, the default for clients that name none."""


@dataclass(frozen=True)
class RestCatalogState:
    """Where the catalog serves, and the store folder its tables live under."""

    pid: int
    port: int
    management_port: int
    log_file: str
    warehouse_location: str

    @property
    def uri(self) -> str:
        """The catalog's ``uri`` property for Iceberg REST clients."""
        return f"http://127.0.0.1:{self.port}/iceberg"


class RestCatalog(LocalServer[RestCatalogState]):
    """Nessie on ROCKSDB: namespaces, tables and their commits survive a kill and a restart. Tables
    go to ``s3://<bucket>/<namespace>/<table>_<uuid>`` on ``store`` (``ObjectStoreState.access``)."""

    kind = "rest"
    title = "Nessie REST catalog"
    state_type = RestCatalogState

    def __init__(
        self, work_dir: Path, store: S3Access, bucket: str, port: int | None = None, host: str = LOCALHOST
    ) -> None:
        super().__init__(work_dir, port, host)
        self.store = store
        self.bucket = bucket
        self._archive: Path | None = None
        """The class-data archive this start maps (None: it dumps to ``_dump`` instead)."""
        self._dump: Path | None = None

    def _launch(self, previous: RestCatalogState | None) -> RestCatalogState:
        jar = single_jar(NESSIE)
        runtime = java(NESSIE_JAVA)
        port = pick_port(self.requested_port, previous.port if previous else None)
        management = pick_port(None, previous.management_port if previous else None, taken=(port,))
        location = self.store.create_bucket(self.bucket) + "/"
        # Quarkus reads ./config/application.properties from its working dir: the S3 secret stays off
        # the command line (visible to every user in `ps`).
        config = self.work_dir / "config" / "application.properties"
        config.parent.mkdir(exist_ok=True)
        config.touch(mode=0o600)
        s3 = "nessie.catalog.service.s3.default-options"
        properties = {
            "nessie.version.store.type": "ROCKSDB",
            "nessie.version.store.persist.rocks.database-path": str(self.work_dir / "nessie-rocksdb"),
            "nessie.catalog.default-warehouse": WAREHOUSE,
            f"nessie.catalog.warehouses.{WAREHOUSE}.location": location,
            f"{s3}.endpoint": self.store.endpoint,
            f"{s3}.path-style-access": "true",
            f"{s3}.region": self.store.region,
            f"{s3}.auth-type": "STATIC",
            f"{s3}.access-key": "urn:nessie-secret:quarkus:fanout-sink.s3",
            "fanout-sink.s3.name": self.store.access_key_id,
            "fanout-sink.s3.secret": self.store.secret_access_key,
            f"{s3}.request-signing-enabled": "false",
            "quarkus.http.host": self.host,
            "quarkus.http.port": str(port),
            "quarkus.management.host": self.host,
            "quarkus.management.port": str(management),
            "quarkus.http.access-log.enabled": "false",
            "quarkus.otel.sdk.disabled": "true",
        }
        config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        heap = os.environ.get("FANOUT_SINK_NESSIE_HEAP", "512m")
        pid = self._spawn(
            [runtime, f"-Xmx{heap}", LIGHT_JIT, *self._class_archive_options(runtime),
             "--enable-native-access=ALL-UNNAMED", "-jar", str(jar)]
        )  # fmt: skip
        return RestCatalogState(
            pid=pid, port=port, management_port=management, log_file=str(self.log_file),
            warehouse_location=location,
        )  # fmt: skip

    def _ready(self, state: RestCatalogState) -> bool:
        return http_status(f"{state.uri}/v1/config") == 200

    # Start-up is class loading and JIT (43-66 s on a loaded 2-core machine, 17 s with both below):
    # C1 alone, since the catalog's load is light, and a class-data archive of the last clean run,
    # handled as the Spark driver's (spark/jvm.py): a truncated archive crashes the JVM, so a run dumps
    # to a file of its own, published by rename only after it stopped cleanly.

    def _class_archive_options(self, runtime: str) -> list[str]:
        name = f"{jars.jar_dir(NESSIE).name}-java{java_major(runtime)}.jsa"
        archive = jars.cache_dir() / "jvm" / name
        archive.parent.mkdir(parents=True, exist_ok=True)
        quiet = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
        if archive.exists():
            self._archive, self._dump = archive, None
            return [f"-XX:SharedArchiveFile={archive}", *quiet]
        self._archive, self._dump = None, archive.with_name(f"{name}.{os.getpid()}.{id(self)}.dump")
        return [f"-XX:ArchiveClassesAtExit={self._dump}", *quiet]

    def start(self, timeout_s: float = 120.0) -> RestCatalogState:
        try:
            return super().start(timeout_s)
        except StackError:
            if self._archive is None:
                raise
            # It started with an archive and failed: the archive may be damaged. Once more without.
            self._archive.unlink(missing_ok=True)
            return super().start(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        super().stop(timeout_s)  # the first clean stop writes the archive: allow it time
        self._settle_archive()

    def kill(self) -> None:
        super().kill()
        self._settle_archive()

    def _settle_archive(self) -> None:
        dump = self._dump
        if dump is None:
            return
        # 143: the JVM ran its shutdown (and the dump) on SIGTERM; SIGKILL or a crash is negative.
        if self.exit_code == JVM_SIGTERM_EXIT and dump.exists():
            os.replace(dump, dump.with_name(dump.name.split(".jsa.")[0] + ".jsa"))
        else:
            dump.unlink(missing_ok=True)
        self._dump = None
