"""Spark's own Iceberg writer as a peer: Kafka source, ``from_json``, ``foreachBatch`` append per table.

What a Spark user writes without fanout_sink: the micro-batch is parsed once with ``from_json``
(``amount`` as a string when its JSON type differs per record kind, which Spark reads as the raw
text), persisted, then each table's rows are filtered, cast to the table's columns and appended
with ``writeTo(table).append()``. Available-now, same session builder, catalog and offsets cap
as the sink. ``run`` starts this module as a child so its JVM and Python are measured as a tree.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from bench.context import RunContext, SystemRun
from bench.landed import landed
from bench.proctree import run_child
from bench.workload import ROUTE_FIELD, Variant, parse_variant
from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark.session import build_spark_session

SYSTEM = "Spark foreachBatch writer"


def _job(args: argparse.Namespace) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    variant: Variant = parse_variant(args.variant)
    settings = CatalogSettings.model_validate_json(args.catalog)
    spark = build_spark_session(settings, master=args.master, app_name="bench-spark-writer")
    amount = StringType() if variant.kind == "mixed" else DoubleType()
    text, long = StringType(), LongType()
    parse = StructType(
        [StructField(name, kind) for name, kind in [
            ("id", text), (ROUTE_FIELD, text), ("seq", long), ("session", text), ("page", text),
            ("country", text), ("amount", amount), ("ts", long), ("agent", text),
        ]]
    )  # fmt: skip

    def write(batch: Any, batch_id: int) -> None:
        rows = batch.select(F.from_json(F.col("value").cast("string"), parse).alias("r")).select("r.*")
        rows.persist()
        for n, table in enumerate(variant.table_names()):
            cast = "string" if variant.amount_is_string(n) else "double"
            (
                rows.filter(F.col(ROUTE_FIELD) == f"t{n}")
                .withColumn("amount", F.col("amount").cast(cast))
                .writeTo(f"{settings.name}.{table}")
                .append()
            )
        rows.unpersist()

    for_each_batch_available_now(spark, args, write)
    spark.stop()


def for_each_batch_available_now(
    spark: Any, args: argparse.Namespace, write: Callable[[Any, int], None]
) -> None:
    """A Spark peer's stream: the whole topic from the earliest offset (committed records only), in
    micro-batches of at most ``args.max_offsets`` (unset: one), each handed to ``write``; returns
    when done."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
    )
    if args.max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets))
    (
        reader.load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )


def run(ctx: RunContext) -> SystemRun:
    catalog = ctx.prepare()
    command = [
        sys.executable, "-m", __name__, "--bootstrap", ctx.bootstrap, "--topic", ctx.topic,
        "--variant", ctx.variant.name, "--catalog", ctx.settings.model_dump_json(), "--master", ctx.master,
        "--checkpoint", str(ctx.folder / "checkpoint"),
    ]  # fmt: skip
    if ctx.max_offsets_per_trigger:
        command += ["--max-offsets", str(ctx.max_offsets_per_trigger)]
    log = ctx.folder / "spark-writer.log"
    child = run_child(command, env=ctx.child_env(), log=log, timeout_s=ctx.timeout_s, cpus=ctx.taskset)
    if child.returncode != 0:
        raise child.failure(SYSTEM, log)
    return SystemRun.of_child(SYSTEM, child, landed(catalog, ctx.variant.table_names()))


def peer_arguments(argv: list[str] | None, description: str, *flags: str) -> argparse.Namespace:
    """A Spark peer child's command line: topic, catalog (JSON), master, checkpoint, offsets cap and
    the peer's own ``flags`` (all required: the parent always passes them)."""
    parser = argparse.ArgumentParser(description=description)
    for flag in ("--bootstrap", "--topic", "--catalog", "--master", "--checkpoint", *flags):
        parser.add_argument(flag, required=True)
    parser.add_argument("--max-offsets", type=int, help="default: unset (Spark plans the whole backlog)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    _job(peer_arguments(argv, __doc__.split("\n")[0], "--variant"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
