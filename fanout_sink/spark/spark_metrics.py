"""The sink's metrics in Spark's own metrics system too, for teams that collect Spark's (JMX, Graphite,
Spark's Prometheus servlet, CSV: whatever ``spark.metrics.conf`` configures).

Spark's metrics system holds Dropwizard metrics of registered *sources*. A source here is a Python
object implementing Spark's ``Source`` interface through py4j (Spark asks it once, at
registration, for its name and its ``MetricRegistry``; the callback server PySpark starts for
``foreachBatch`` answers). Its registry is a JVM ``MetricRegistry`` that Spark's registry listens
to, so a gauge added later (a new table, a new partition) shows up in Spark's sinks too. After every
update of the sink's Prometheus registry the changed samples are copied into
``DefaultSettableGauge``s, one py4j call per changed value: the Prometheus registry stays the one
place where a value is computed.

Names: ``<app id>.driver.fanout_sink.<metric>[.<label value>...]``, the metric as in Prometheus
without its ``fanout_sink_`` prefix and the ``sink`` label (the app is the sink), e.g.
``rows_committed_total.shop.orders`` or ``partition_lag.orders.3``. Left out: histogram buckets
and ``_created`` samples (``_count`` and ``_sum`` are kept), the info metric, and the ``_age_seconds``
gauges: Prometheus computes those at scrape time, while a copy here would freeze at the last update
and hide exactly the stall it should show (compute the age from ``*vtts_timestamp_seconds`` instead).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

SOURCE_NAME = "fanout_sink"
_PREFIX = "fanout_sink_"
_LEFT_OUT = ("_bucket", "_created", "_age_seconds")


class _SinkSource:
    """Spark's ``org.apache.spark.metrics.source.Source``, implemented in Python for py4j."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def sourceName(self) -> str:
        return SOURCE_NAME

    def metricRegistry(self) -> Any:
        return self.registry

    class Java:
        implements = ("org.apache.spark.metrics.source.Source",)


def dropwizard_name(name: str, labels: dict[str, str]) -> str:
    """A Prometheus sample's name in Spark's dotted hierarchy (see the module docstring)."""
    parts = [name.removeprefix(_PREFIX)]
    parts += [value for key, value in labels.items() if key != "sink"]
    return ".".join(parts)


class SparkMetricsMirror:
    """Copies a Prometheus registry into Spark's metrics system on the driver; call :meth:`update`
    after each change (from any thread)."""

    def __init__(self, spark: Any, registry: CollectorRegistry) -> None:
        from pyspark.java_gateway import ensure_callback_server_started

        context = spark.sparkContext
        ensure_callback_server_started(context._gateway)  # type: ignore[no-untyped-call]
        self._jvm = context._jvm
        self._registry = registry
        self._lock = threading.Lock()
        self._gauges: dict[str, tuple[Any, float]] = {}
        self._source_registry = self._jvm.com.codahale.metrics.MetricRegistry()
        self.update()
        self._jvm.org.apache.spark.SparkEnv.get().metricsSystem().registerSource(
            _SinkSource(self._source_registry)
        )

    def update(self) -> None:
        with self._lock:
            for family in self._registry.collect():
                if family.type == "info":
                    continue
                for sample in family.samples:
                    if sample.name.endswith(_LEFT_OUT) or math.isnan(sample.value):
                        continue
                    self._set(dropwizard_name(sample.name, sample.labels), float(sample.value))

    def _set(self, name: str, value: float) -> None:
        known = self._gauges.get(name)
        if known is None:
            gauge = self._jvm.com.codahale.metrics.DefaultSettableGauge(value)
            self._source_registry.register(name, gauge)
        elif known[1] != value:
            gauge = known[0]
            gauge.setValue(value)
        else:
            return
        self._gauges[name] = (gauge, value)
