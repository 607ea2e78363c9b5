"""How the app's process runs: ``spark:`` (its session and batches), ``metrics:`` (the Prometheus
endpoint) and ``logging:``."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from fanout_sink.config.fields import Duration, Section
from fanout_sink.logs import LogFormat, LogLevel


class SparkSettings(Section):
    """``spark:`` read by the Spark app."""

    master: str = Field(default="local[*]", examples=["local[*]"])
    trigger_interval: Duration = Field(default=timedelta(seconds=10), examples=["10s"])
    available_now: bool = Field(default=False, examples=[True])
    """Spark's ``Trigger.AvailableNow``: deliver what the topics hold at start, commit, exit 0 (as
    ``run --available-now``). For runs a scheduler starts (cron, Airflow) and for ``spark-submit``,
    whose command line is Spark's, not the app's."""
    max_offsets_per_trigger: int | None = Field(default=None, ge=1, examples=[100000])
    max_records_per_batch: int = Field(default=50_000, ge=1_000, le=10_000_000, examples=[50000])
    """Records a task reads, decodes, routes and converts at once (named after Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``): a Python worker's memory holds one such chunk's
    working set, whatever ``max-offsets-per-trigger`` is; append tables' files still roll at their
    target size across chunks."""
    partition_groups: int | None = Field(default=None, ge=1, le=100_000, examples=[8])
    """Groups the source partitions are packed into: a batch runs one Spark task per group that has
    data, delivering all its partitions' ranges in one Kafka transaction. Unset: the executors' cores
    as the app sees them at start (``spark.default.parallelism``, the cores of a ``local[N]`` master,
    or ``spark.executor.instances`` x ``spark.executor.cores``). A partition keeps its group while the
    count stays; a restart with another count fences the old groups' transactional ids first."""
    groups_per_task: int = Field(default=1, ge=1, le=64, examples=[2])
    """Partition groups one Spark task delivers, each on a thread of its own with its own consumer
    and transactional producer (each group's transaction and offsets are exactly as with one group a
    task). A Python worker process runs one task at a time, so a batch of N groups forks about
    N / ``groups-per-task`` Python workers per executor instead of N: one worker's imports, heap and
    catalog instead of two (``docs/benchmarks/memory.md``). The reading, the native copy, Arrow's
    parse and Parquet's write release the GIL; what is Python holds it, so the threads share one
    core for that part."""
    checkpoint_location: str | None = Field(default=None, examples=["/var/lib/fanout-sink/checkpoints"])
    conf: dict[str, str] = Field(
        default_factory=dict,
        examples=[{"spark.driver.memory": "1g", "spark.executorEnv.MALLOC_ARENA_MAX": "4"}],
    )
    """Spark properties for the app's session, under Spark's own names; they override the sink's
    memory defaults (``spark.driver.memory`` 512m, the serial collector in
    ``spark.driver.extraJavaOptions``, the workers' allocators in ``spark.executorEnv.*``: see
    ``fanout_sink/spark/footprint.py``), and ``--conf`` of ``fanout-sink run`` overrides them."""


class MetricsSettings(Section):
    """``metrics:`` the driver's Prometheus endpoint (``/metrics``); present = on.

    Absent means off, so the embedded default and several sinks on one machine never fight over a
    port; a production config sets it (``metrics: {}`` serves on 127.0.0.1:9464, the port
    OpenTelemetry reserved for Prometheus exporters; ``host: 0.0.0.0`` for a scraper elsewhere,
    ``port: 0`` for any free port, logged).
    """

    host: str = Field(default="127.0.0.1", examples=["0.0.0.0"])
    port: int = Field(default=9464, ge=0, le=65535, examples=[9464])


class LoggingSettings(Section):
    """``logging:`` the sink's log on stderr, on the driver and the executors alike (``--log-format``
    and ``--log-level`` of ``fanout-sink run`` override it): ``plain`` text or ``json`` lines."""

    format: LogFormat = Field(default="plain", examples=["json"])
    level: LogLevel = Field(default="INFO", examples=["INFO"])
