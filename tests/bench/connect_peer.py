"""The Apache Iceberg Kafka Connect sink as a peer, in Kafka Connect standalone built from Maven Central.

The worker's classpath (``poms/connect-worker.xml``) and the plugin folder
(``poms/iceberg-connect-plugin.xml``; the official runtime ZIP is not on Maven Central) are fetched
and cached like every other jar set. Routing is by the route field, static (one regex per table)
or dynamic (the field names the table); the tables exist before the connector starts (created by
PyIceberg in the same SQLite file, which Iceberg's JdbcCatalog reads when the catalog names match);
the commit interval equals the sink's.
Connect never finishes on its own: the run is done when every record is visible, then SIGTERM.
The worker flushes offsets at the commit interval (see ``offset.flush.interval.ms`` below).
"""

from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka.cimpl import NewTopic

from bench.context import RunContext, SystemRun
from bench.landed import landed
from bench.proctree import run_child
from bench.workload import ROUTE_FIELD
from fanout_sink import jars
from fanout_sink.catalog import CatalogSettings, sqlite_path
from fanout_sink.devtools.stack.broker import free_port
from fanout_sink.kafka.clients import KafkaClientFactory

CONNECT_WORKER = jars.JarSet("connect-worker", "bench")
ICEBERG_CONNECT_PLUGIN = jars.JarSet("iceberg-connect-plugin", "bench")
SYSTEM = "Iceberg Kafka Connect sink"
LOG = "connect.log"
_LOG4J2 = """status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d %p %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.commit.name = org.apache.iceberg.connect.channel
logger.commit.level = info
"""


def _jar_version(jar_set: jars.JarSet, artifact: str) -> str:
    for jar in jars.jars(jar_set):
        version = jar.name.removeprefix(f"{artifact}-").removesuffix(".jar")
        if version != jar.name and version[:1].isdigit():
            return version
    return "unknown"


def iceberg_version() -> str:
    """The Iceberg release the plugin carries (fetches the jars when missing), read off a jar's name."""
    return _jar_version(ICEBERG_CONNECT_PLUGIN, "iceberg-kafka-connect")


def kafka_version() -> str:
    """The Kafka Connect release the worker runs."""
    return _jar_version(CONNECT_WORKER, "connect-runtime")


def _properties(values: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


def _plugin_path(folder: Path) -> Path:
    """Connect wants a folder *of* plugin folders; the cached jar folder is one plugin."""
    plugins = folder / "plugins"
    plugins.mkdir()
    (plugins / "iceberg").symlink_to(jars.fetch(ICEBERG_CONNECT_PLUGIN), target_is_directory=True)
    return plugins


def create_control_topic(bootstrap: str, control: str) -> None:
    """The connector's control topic: one partition, made before Connect starts."""
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    admin.create_topics([NewTopic(control, 1, 1)])[control].result(timeout=30)


def catalog_properties(settings: CatalogSettings) -> dict[str, str]:
    """The connector's ``iceberg.catalog*`` keys for the run's SQLite catalog: Iceberg's JdbcCatalog on
    the file PyIceberg's SQL catalog writes (same catalog name, JDBC schema V1)."""
    return {
        "iceberg.catalog": settings.name,
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "iceberg.catalog.uri": f"jdbc:sqlite:{sqlite_path(settings.uri or '')}",
        "iceberg.catalog.jdbc.schema-version": "V1",
        "iceberg.catalog.clients": "1",
        "iceberg.catalog.warehouse": settings.warehouse or "",
    }


def standalone_command(
    folder: Path, bootstrap: str, commit_interval_s: float, connector: dict[str, str], heap: str = "2g"
) -> list[str]:
    """Write the worker, connector and log4j2 files into ``folder`` and return Connect standalone's
    command line running ``connector``."""
    worker = {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(folder / "connect.offsets"),
        "listeners": f"http://127.0.0.1:{free_port()}",
        "plugin.path": str(_plugin_path(folder)),
        "consumer.isolation.level": "read_committed",
        # A sink task's poll waits for the next offset flush when no records come (60 s by default),
        # and the Iceberg task answers the coordinator's commit request only from put(): without this
        # the last records of a finite input wait up to a minute for their commit.
        "offset.flush.interval.ms": str(int(commit_interval_s * 1000)),
        "plugin.discovery": "service_load",  # what Connect itself advises for these jars: faster start-up
    }
    (folder / "worker.properties").write_text(_properties(worker))
    (folder / "connector.properties").write_text(_properties(connector))
    (folder / "log4j2.properties").write_text(_LOG4J2)
    classpath = os.path.join(jars.fetch(CONNECT_WORKER), "*")
    return [
        "java", "-Xms256m", f"-Xmx{heap}", f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}",
        "-cp", classpath, "org.apache.kafka.connect.cli.ConnectStandalone",
        str(folder / "worker.properties"), str(folder / "connector.properties"),
    ]  # fmt: skip


def connector_command(ctx: RunContext, *, dynamic: bool = False) -> list[str]:
    """Create the run's control topic, write the worker, connector and log4j2 files into its folder
    (the tables already created), and return the Connect worker's command line.

    Static routing (the default) names each table with a route regex on the route field; ``dynamic``
    takes the field's value as the table's identifier (``iceberg.tables.dynamic-enabled``), as a
    sink of hundreds of tables routes: one regex per table is matched against every record.
    """
    name = ctx.unique_name("iceberg")
    control = f"{name}-control"
    create_control_topic(ctx.bootstrap, control)
    tables = ctx.variant.table_names()
    routing = (
        {"iceberg.tables.dynamic-enabled": "true"}
        if dynamic
        else {
            "iceberg.tables": ",".join(tables),
            **{f"iceberg.table.{t}.route-regex": f"^{t.rsplit('.', 1)[1]}$" for t in tables},
        }
    )
    connector = {
        "name": name,
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": str(ctx.cores),
        "topics": ctx.topic,
        "iceberg.tables.route-field": ROUTE_FIELD,
        **routing,
        "iceberg.control.topic": control,
        "iceberg.control.group-id-prefix": f"{name}-cg",
        "iceberg.control.commit.interval-ms": str(int(ctx.commit_interval_s * 1000)),
        **catalog_properties(ctx.settings),
        "iceberg.kafka.bootstrap.servers": ctx.bootstrap,
    }
    return standalone_command(ctx.folder, ctx.bootstrap, ctx.commit_interval_s, connector, ctx.connect_heap)


def run(ctx: RunContext) -> SystemRun:
    catalog = ctx.prepare()
    command = connector_command(ctx)
    visible = ctx.visible()
    log = ctx.folder / LOG
    child = run_child(
        command,
        env=ctx.child_env(),
        log=log,
        done=lambda: visible.total() >= ctx.records,
        timeout_s=ctx.timeout_s,
        cpus=ctx.taskset,
    )
    if visible.total() < ctx.records:
        raise child.failure(SYSTEM, log, "exited before every row was visible")
    return SystemRun.of_child(SYSTEM, child, landed(catalog, ctx.variant.table_names()))
