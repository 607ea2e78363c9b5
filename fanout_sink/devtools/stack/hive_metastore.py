"""Apache Hive's standalone metastore on 127.0.0.1 (thrift), from Maven Central jars: the catalog most
Spark deployments outside a REST catalog keep their tables in (``catalog: {type: hive, uri: thrift://...}``).

Its state is an embedded Derby database in the work dir, created on the first start by Hive's own
``schematool -initSchema`` (the schema includes the lock tables that Iceberg's and PyIceberg's Hive
commits take a lock in; DataNucleus's ``autoCreateAll`` would not create them). Tables live in a local
folder of the work dir (``file://``); the metastore keeps only each table's pointer to its current
metadata file. Kept across a kill and a restart.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from fanout_sink import jars
from fanout_sink.devtools.stack.broker import log_tail
from fanout_sink.devtools.stack.service import CatalogServerState, LocalServer, java, pick_port
from fanout_sink.errors import StackError
from fanout_sink.spark.jvm import LIGHT_JIT

HIVE_METASTORE = jars.JarSet("hive-metastore", "fanout_sink.devtools.stack")
"""Hive 3.1.3's standalone metastore, Hadoop's client jars and the Derby schema scripts
(``poms/hive-metastore.xml``)."""
MAIN_CLASS = "org.apache.hadoop.hive.metastore.HiveMetaStore"
SCHEMA_TOOL = "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool"
SCRIPTS = "scripts/metastore/upgrade/derby/"
"""Where the bin tarball keeps the Derby scripts schematool runs (under its top folder)."""


@dataclass(frozen=True)
class HiveMetastoreState(CatalogServerState):
    """Where the metastore serves; ``database`` is its Derby database's folder."""

    @property
    def uri(self) -> str:
        """The catalog's ``uri`` for PyIceberg's and Iceberg Java's HiveCatalog."""
        return f"thrift://127.0.0.1:{self.port}"


class HiveMetastore(LocalServer[HiveMetastoreState]):
    """Hive's metastore on embedded Derby; tables under ``<work_dir>/warehouse``."""

    kind = "hive-metastore"
    title = "Hive Metastore"
    state_type = HiveMetastoreState

    @property
    def database_dir(self) -> Path:
        return self.work_dir / "metastore_db"

    def _launch(self, previous: HiveMetastoreState | None) -> HiveMetastoreState:
        jar_dir = jars.fetch(HIVE_METASTORE)
        port = pick_port(self.requested_port, previous.port if previous else None)
        warehouse = self.work_dir / "warehouse"
        warehouse.mkdir(parents=True, exist_ok=True)
        conf_dir = self.work_dir / "conf"
        conf_dir.mkdir(exist_ok=True)
        (conf_dir / "metastore-site.xml").write_text(self._site_xml(warehouse.as_uri(), port))
        # The config folder first: Hive reads metastore-site.xml from the classpath.
        classpath = f"{conf_dir}:{jar_dir / '*'}"
        if not (self.database_dir / "service.properties").exists():
            self._init_schema(jar_dir, classpath)
        pid = self._spawn([java(), "-Xmx512m", LIGHT_JIT, "-cp", classpath, MAIN_CLASS, "-p", str(port)])
        return HiveMetastoreState(
            pid=pid, port=port, log_file=str(self.log_file), warehouse_location=warehouse.as_uri(),
            database=str(self.database_dir),
        )  # fmt: skip

    def _site_xml(self, warehouse: str, port: int) -> str:
        settings = {
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={self.database_dir};create=true",
            "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
            "metastore.warehouse.dir": warehouse,
            "metastore.thrift.bind.host": self.host,
            "metastore.thrift.port": str(port),
            # The defaults name classes of hive-exec, which the standalone metastore does not ship.
            "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
            "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask",
        }
        properties = "".join(
            f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
            for k, v in settings.items()
        )
        return f"<configuration>\n{properties}</configuration>\n"

    def _init_schema(self, jar_dir: Path, classpath: str) -> None:
        """Create the Derby database with Hive's schema: the scripts out of the bin tarball, then
        schematool (in the foreground, into the server's log)."""
        home = self.work_dir / "metastore-home"
        scripts = home / SCRIPTS
        if not scripts.is_dir():
            tarballs = sorted(jar_dir.glob("*-bin.tar.gz"))
            if not tarballs:
                raise StackError(
                    f"the {HIVE_METASTORE.name} jar set has no bin tarball with the schema scripts",
                    f"delete {jar_dir} and retry (it is fetched again)",
                )
            with tarfile.open(tarballs[0]) as archive:
                for member in archive.getmembers():
                    inner = member.name.partition("/")[2]
                    if inner.startswith(SCRIPTS) and member.isfile():
                        target = home / inner
                        target.parent.mkdir(parents=True, exist_ok=True)
                        source = archive.extractfile(member)
                        assert source is not None
                        target.write_bytes(source.read())
        env = {**os.environ, "METASTORE_HOME": str(home)}
        with self.log_file.open("ab") as log:
            done = subprocess.run(
                [java(), LIGHT_JIT, "-cp", classpath, SCHEMA_TOOL, "-dbType", "derby", "-initSchema"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.work_dir,
                env=env, timeout=300, check=False,
            )  # fmt: skip
        if done.returncode != 0:
            raise StackError(
                f"Hive's schematool could not create the metastore's database (exit {done.returncode})",
                f"read its log; delete {self.database_dir} to start over",
                f"last lines of {self.log_file}:\n{log_tail(self.log_file, 30)}",
            )

    def _ready(self, state: HiveMetastoreState) -> bool:
        # The thrift port opens once the metastore has read its database: a connection means it serves.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            return sock.connect_ex(("127.0.0.1", state.port)) == 0
