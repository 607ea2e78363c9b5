"""The change benchmark's peer: Spark Structured Streaming ``foreachBatch`` + ``MERGE INTO``.

What a PySpark user writes to replicate a Debezium topic without fanout_sink: each micro-batch is
parsed with ``from_json``, narrowed to the table's events (``source.table``), deduplicated to the
last change per key (a window by key ordered by Kafka offset: a key's changes are in one
partition), and merged into the table: a delete removes the row, anything else updates or inserts
it. The table is format v2 with merge-on-read for MERGE, UPDATE and DELETE
(:data:`~.change_stream.MERGE_ON_READ`), so Iceberg 1.11 writes position-delete files, as the
sink does. Available-now, same session builder, catalog and offsets cap as the sink; ``run``
starts this module as a child so its JVM and Python are measured as one process tree.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.change_stream import COLUMNS, KEY, SOURCE_TABLE, TABLE
from bench.proctree import ChildRun, run_child
from bench.spark_writer import for_each_batch_available_now, peer_arguments
from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark.session import build_spark_session

SYSTEM = "Spark foreachBatch + MERGE INTO"
FIRST_BATCH_LINE = "merge peer: first batch started at "
_ROW = (
    "STRUCT<id BIGINT, name STRING, email STRING, country STRING, status STRING, amount STRING, "
    "points INT, updated_at STRING>"
)
ENVELOPE = f"before {_ROW}, after {_ROW}, source STRUCT<`table` STRING>, op STRING, ts_ms BIGINT"
"""The part of a Debezium envelope the peer reads, as a Spark DDL schema for ``from_json``."""


def merge_statement(table: str, source: str) -> str:
    """MERGE of the deduplicated changes in view ``source`` (columns: the table's and ``op``)."""
    assignments = ", ".join(f"t.{c} = s.{c}" for c in COLUMNS if c != KEY)
    return (
        f"MERGE INTO {table} t USING {source} s ON t.{KEY} = s.{KEY} "
        "WHEN MATCHED AND s.op = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {assignments} "
        f"WHEN NOT MATCHED AND s.op != 'd' THEN INSERT ({', '.join(COLUMNS)}) "
        f"VALUES ({', '.join(f's.{c}' for c in COLUMNS)})"
    )


def merge_batch(batch: Any, table: str) -> None:
    """Merge one micro-batch of the Kafka source (columns ``value`` and ``offset``) into ``table``:
    the table's events parsed, the last change per key kept, then one MERGE."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    events = (
        batch.select("offset", F.from_json(F.col("value").cast("string"), ENVELOPE).alias("e"))
        .where(F.col("e.source.table") == SOURCE_TABLE)
        .withColumn(KEY, F.coalesce(F.col("e.after.id"), F.col("e.before.id")))
    )
    latest = Window.partitionBy(KEY).orderBy(F.col("offset").desc())
    last = events.withColumn("n", F.row_number().over(latest)).where(F.col("n") == 1)
    typed = {"amount": "decimal(12,2)", "points": "int", "updated_at": "timestamp"}
    rows = last.select(
        F.col(KEY),
        *[F.col(f"e.after.{c}").cast(typed.get(c, "string")).alias(c) for c in COLUMNS if c != KEY],
        F.col("e.op").alias("op"),
    )
    rows.createOrReplaceTempView("changes")
    batch.sparkSession.sql(merge_statement(table, "changes"))


def _job(args: argparse.Namespace) -> None:
    settings = CatalogSettings.model_validate_json(args.catalog)
    spark = build_spark_session(settings, master=args.master, app_name="bench-merge-peer")
    table = f"{settings.name}.{TABLE}"
    started: list[float] = []

    def merge(batch: Any, _: int) -> None:
        if not started:  # start-up ends here; the parent reads the line from the log
            started.append(time.time())
            print(f"{FIRST_BATCH_LINE}{started[0]:.3f}", flush=True)
        merge_batch(batch, table)

    for_each_batch_available_now(spark, args, merge)
    spark.stop()


def first_batch_started(log: str) -> float | None:
    """When the peer's first micro-batch started (epoch seconds), from its log."""
    for line in log.splitlines():
        if line.startswith(FIRST_BATCH_LINE):
            return float(line.removeprefix(FIRST_BATCH_LINE))
    return None


def run(
    bootstrap: str,
    topic: str,
    settings: CatalogSettings,
    master: str,
    checkpoint: str,
    max_offsets: int,
    env: dict[str, str],
    log: Any,
) -> ChildRun:
    """Run the peer over the whole topic as a measured child; a failed run stops the benchmark."""
    command = [
        sys.executable, "-m", __name__, "--bootstrap", bootstrap, "--topic", topic,
        "--catalog", settings.model_dump_json(), "--master", master, "--checkpoint", checkpoint,
        "--max-offsets", str(max_offsets),
    ]  # fmt: skip
    child = run_child(command, env=env, log=log)
    if child.returncode != 0:
        raise child.failure(SYSTEM, log)
    return child


def main(argv: list[str] | None = None) -> int:
    _job(peer_arguments(argv, (__doc__ or "").split("\n")[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
