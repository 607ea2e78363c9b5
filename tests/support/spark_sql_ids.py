"""Child process: the ids of tables as Spark SQL reads them, through the Spark side the sink derives.

Usage: python spark_sql_ids.py '<json: catalog (CatalogSettings), tables>'; prints {table: [ids]}.
A process of its own because the session needs the catalog's jars (the S3 ones for an S3 warehouse)
on its classpath from the start, which the suite's shared local session was not started with.
"""

from __future__ import annotations

import json
import sys

from fanout_sink.catalog import CatalogSettings
from fanout_sink.spark.session import build_spark_session


def main() -> int:
    cfg = json.loads(sys.argv[1])
    settings = CatalogSettings.model_validate(cfg["catalog"])
    spark = build_spark_session(settings, master="local[1]", app_name="spark-sql-ids")
    ids = {
        table: [row.id for row in spark.sql(f"SELECT id FROM {settings.name}.{table}").collect()]
        for table in cfg["tables"]
    }
    spark.stop()
    print(json.dumps(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
