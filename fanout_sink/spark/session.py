"""Builds the Spark session every entry point uses: connector jars on the classpath, Iceberg wired in.

``local[*]`` is the embedded default; under ``spark-submit`` the master and resources come from the
submit command, and only what is not already set there is filled in here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from fanout_sink import jars
from fanout_sink.catalog import CatalogSettings, is_s3_location, spark_catalog_conf, spark_storage_conf
from fanout_sink.config.secrets import SECRET_KEY_PATTERN
from fanout_sink.spark import jvm_stderr, shipping
from fanout_sink.spark.jvm import DriverJvm, driver_java_options

log = logging.getLogger(__name__)

_JAVA_OPTIONS = "spark.driver.extraJavaOptions"

SPARK_CONNECTORS = jars.JarSet("spark-connectors", "fanout_sink.spark")
"""Spark's Kafka source, Iceberg's Spark runtime, the SQLite and PostgreSQL JDBC drivers
(``poms/spark-connectors.xml``)."""

SPARK_OBJECT_STORE = jars.JarSet("spark-object-store", "fanout_sink.spark")
"""The AWS SDK for Iceberg's S3FileIO and Hadoop's s3a (``poms/spark-object-store.xml``, 65 MB):
added only when the catalog or the checkpoint is on S3, so the embedded default does not fetch it.
A REST or Glue catalog counts as S3: the server, not the client, knows where tables live (a REST
server may vend the store's credentials), and Iceberg Java's default FileIO there resolves
``s3://`` locations to S3FileIO."""

_REMOTE_CATALOGS = {"rest", "glue"}


def log4j_options(log_format: str) -> str:
    """The driver JVM's log4j2 configuration for the sink's ``logging.format`` (``log4j2/*.properties``):
    Spark at WARN in the sink's format, without the repeats of a failed task's traceback."""
    path = resources.files("fanout_sink.spark").joinpath(f"log4j2/{log_format}.properties")
    return f"-Dlog4j2.configurationFile={path}"


def connector_jars(catalog: CatalogSettings | None, checkpoint: str | None = None) -> list[str]:
    """The jars Spark needs for this catalog and checkpoint location (fetched when missing)."""
    sets = [SPARK_CONNECTORS]
    on_s3 = catalog is not None and (catalog.type in _REMOTE_CATALOGS or bool(spark_storage_conf(catalog)))
    if on_s3 or is_s3_location(checkpoint):
        sets.append(SPARK_OBJECT_STORE)
    return [str(path) for jar_set in sets for path in jars.jars(jar_set)]


def spark_conf(
    catalog: CatalogSettings | None,
    extra: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
) -> dict[str, str]:
    """Every Spark property the sink sets, as one dict (tests and ``spark-submit --conf`` reuse it)."""
    jar_paths = connector_jars(catalog, checkpoint)
    conf = {
        "spark.jars": ",".join(jar_paths),
        # JDBC drivers are looked up by the driver's system class loader, which spark.jars does not reach.
        "spark.driver.extraClassPath": os.pathsep.join(jar_paths),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "spark.pyspark.driver.python": sys.executable,
        # Spark hides conf entries and data source options whose key or value matches this, in logs,
        # event logs and the UI. Its default misses catalog keys such as s3.access-key-id and
        # adls.account-key, so it gets the names the sink's config treats as secret.
        "spark.redaction.regex": f"(?i){SECRET_KEY_PATTERN}",
    }
    if catalog is not None:
        conf.update(spark_catalog_conf(catalog))
        conf.update(spark_storage_conf(catalog))
    conf.update(extra or {})
    return conf


def build_spark_session(
    catalog: CatalogSettings | None = None,
    master: str | None = None,
    app_name: str = "fanout-sink",
    extra_conf: Mapping[str, str] | None = None,
    light_jit: bool = False,
    checkpoint: str | None = None,
    log_format: str = "plain",
) -> Any:
    """A SparkSession with the sink's jars and catalog; ``master`` defaults to ``local[*]``.

    ``light_jit`` is for the app, whose driver JVM never handles records (see :mod:`.jvm`).
    ``log_format`` is the sink's ``logging.format``, which Spark's own lines follow too.
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    # Under spark-submit the JVM exists already (PYSPARK_GATEWAY_PORT is set) and owns the master: the
    # config's spark.master (local[*] by default) must not override the submit command's --master.
    resolved_master = None if "PYSPARK_GATEWAY_PORT" in os.environ else (master or "local[*]")
    if resolved_master is not None and resolved_master.startswith("local"):
        # A local run talks to itself only: keep Spark's driver and block manager on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # PySpark picks the Python of its workers from this variable (not from spark.pyspark.python);
        # without it they run a bare `python3` that lacks the sink's packages.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cluster: dict[str, str] = {}
    if resolved_master is not None and not resolved_master.startswith("local"):
        # Executors run the packed environment's Python (see :mod:`.shipping`); PySpark takes the
        # workers' Python from this variable, as for a local master.
        cluster = shipping.cluster_conf(resolved_master)
        os.environ["PYSPARK_PYTHON"] = shipping.EXECUTOR_PYTHON
    builder = SparkSession.builder.appName(app_name)
    if resolved_master is not None:
        builder = builder.master(resolved_master)
    conf = spark_conf(catalog, {**cluster, **(extra_conf or {})}, checkpoint)
    for key, value in conf.items():
        builder = builder.config(key, value)
    launching = "PYSPARK_GATEWAY_PORT" not in os.environ
    jvm = DriverJvm.plan(conf["spark.driver.extraClassPath"].split(os.pathsep)) if launching else None
    # The user's options come last: a -Dlog4j2.configurationFile of theirs wins.
    user_options = " ".join(filter(None, (log4j_options(log_format), conf.get(_JAVA_OPTIONS))))
    if jvm is not None:
        builder = builder.config(_JAVA_OPTIONS, driver_java_options(jvm, light_jit, user_options))
    # A JVM PySpark launches now writes its stderr through the filter (without its incubator notice).
    starting = jvm_stderr.filtered() if launching else contextlib.nullcontext()
    started = time.monotonic()
    try:
        with starting:
            session = builder.getOrCreate()
    except PySparkRuntimeError:
        if jvm is None or jvm.archive is None or jvm.dumping:
            raise
        jvm.discard()  # a damaged archive makes the JVM exit at once: start once more without it
        jvm = None
        builder = builder.config(
            _JAVA_OPTIONS, driver_java_options(DriverJvm(None, False), light_jit, user_options)
        )
        with jvm_stderr.filtered():
            session = builder.getOrCreate()
    if jvm is not None:
        jvm.publish_at_exit(session)
        gateway = session.sparkContext._jvm
        assert gateway is not None  # a session PySpark launched has its gateway
        pid = gateway.java.lang.ProcessHandle.current().pid()
        log.info("Spark session ready in %.1fs (%s)", time.monotonic() - started, jvm.check_mapped(pid))
    session.sparkContext.setLogLevel(os.environ.get("FANOUT_SINK_SPARK_LOG_LEVEL", "WARN"))
    return session


class LazySession:
    """A Spark session started on its first use: ``fanout-sink maintain`` over small tables runs every
    step in process and then starts no driver JVM at all (seconds of CPU and hundreds of MB beside
    the sink). ``stop`` stops the session if one was started."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._session: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._session is None:
            self._session = self._build()
        return getattr(self._session, name)

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
