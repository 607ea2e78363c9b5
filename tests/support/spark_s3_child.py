"""Child process: a Spark session built by the sink's own ``spark_conf`` for one catalog on S3.

A process holds one SparkContext, and the suite's shared session is started without the object-store
jars, so the S3 tests drive Spark here. Input: one JSON argument ``{"catalog": <CatalogSettings as
JSON>, "more_catalogs": [...], "sql": [statements], "stream": {...}}``; output: one JSON line on
stdout with the rows of every statement (``sql``) and what the sink's planner read from the checkpoint
(``stream``). The session is built for ``catalog``; each of ``more_catalogs`` is added with the Spark
properties the sink derives for it (Spark reads ``spark.sql.catalog.*`` when a name is first used),
so one JVM start serves several catalogs.

``maintain`` = a sink's YAML file runs the sink's table maintenance (``fanout-sink maintain``'s
``maintain``) on its tables first, so ``sql`` reads the maintained tables; ``"maintain"`` in the output
is what it did per table.

``stream`` = ``{"bootstrap": ..., "topic": ..., "checkpoint": "s3a://..."}`` runs Spark's Kafka
source to its end (trigger availableNow) with a no-op sink and the checkpoint on the object store,
then reads it back through ``planning`` and moves it aside like a restart ahead of the sink group.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from fanout_sink.catalog import CatalogSettings, spark_catalog_conf
from fanout_sink.config.loading import load_config
from fanout_sink.spark import planning
from fanout_sink.spark.maintenance import maintain
from fanout_sink.spark.session import build_spark_session


def _rows(spark: Any, statement: str) -> list[list[Any]]:
    return [list(row) for row in spark.sql(statement).collect()]


def _stream(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    checkpoint = spec["checkpoint"]
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", spec["bootstrap"])
        .option("subscribe", spec["topic"])
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    ends = planning.last_committed_ends(checkpoint, spark) or {}
    ranges = planning.planned_ranges(checkpoint, 0, spark)
    # Ahead of a sink group that delivered nothing (offset 0): the planner moves the checkpoint aside.
    planning.reconcile_checkpoint(checkpoint, dict.fromkeys(ends, 0), spark)
    return {
        "ends": [[t, p, o] for (t, p), o in sorted(ends.items())],
        "ranges": [[t, p, s, e] for (t, p), (s, e) in sorted(ranges.items())],
        "files_left_after_move": planning.HadoopCheckpoint(checkpoint, spark).file_paths(),
    }


def _maintain(spark: Any, config_file: str) -> list[dict[str, Any]]:
    results = maintain(spark, load_config(config_file))
    return [
        {
            "table": result.table,
            "before": dataclasses.asdict(result.before),
            "after": dataclasses.asdict(result.after),
            "steps": {step.name: [step.action, step.detail] for step in result.steps},
        }
        for result in results
    ]


def main() -> None:
    spec = json.loads(sys.argv[1])
    catalog = CatalogSettings.model_validate_json(spec["catalog"])
    checkpoint = spec.get("stream", {}).get("checkpoint")
    spark = build_spark_session(catalog, master="local[1]", app_name="s3-child", checkpoint=checkpoint)
    try:
        for more in spec.get("more_catalogs", []):
            for key, value in spark_catalog_conf(CatalogSettings.model_validate_json(more)).items():
                spark.conf.set(key, value)
        out: dict[str, Any] = {}
        if "maintain" in spec:
            out["maintain"] = _maintain(spark, spec["maintain"])
        out["sql"] = [_rows(spark, statement) for statement in spec.get("sql", [])]
        if "stream" in spec:
            out["stream"] = _stream(spark, spec["stream"])
    finally:
        spark.stop()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
