"""How healthy one table is: its files, snapshots, manifests and metadata bytes, and how long a
typical read takes through PyIceberg and through Spark SQL.

The reads are what a dashboard or an analyst would run on an events table: a full ``count(*)`` and
a filtered query on the recent minutes of one country (the filter prunes by partition and column
bounds, so the number of files and manifests shows in its time). Each is timed ``repeat`` times and
the median kept; the filtered query's row count is kept too, so before and after can be compared.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pyarrow import fs
from pyiceberg.table import Table

from fanout_sink.maintenance.decisions import live_manifests
from fanout_sink.status import data_file_stats

SCANS = ("pyiceberg_count", "pyiceberg_filtered", "spark_count", "spark_filtered")
FILTER_COUNTRY = "DE"
FILTER_MINUTES = 10
"""The filtered query reads the last this many (simulated) minutes of one country."""


@dataclass(frozen=True)
class TableHealth:
    table: str
    rows: int
    filtered_rows: int
    data_files: int
    data_bytes: int
    snapshots: int
    manifests: int
    """Manifests the current snapshot lists (a rewrite's snapshot also lists those of what it removed)."""
    live_manifests: int
    """Those of them with live files: what the next commit keeps and scans read."""
    metadata_files: int
    metadata_bytes: int
    metadata_json_bytes: int
    scan_s: dict[str, float]
    """Median seconds per entry of :data:`SCANS` (the Spark ones absent without a session)."""

    @property
    def average_file_kb(self) -> float:
        return self.data_bytes / self.data_files / 1024 if self.data_files else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def metadata_footprint(table: Table) -> tuple[int, int, int]:
    """Files and bytes under the table's ``metadata/`` folder (metadata JSONs, manifest lists and
    manifests, reachable or not: what the storage holds and a full listing walks), and the bytes of
    the metadata JSONs among them (expiry does not delete those; Iceberg's
    ``write.metadata.delete-after-commit.enabled`` does)."""
    filesystem, root = fs.FileSystem.from_uri(table.location())
    infos = filesystem.get_file_info(fs.FileSelector(f"{root.rstrip('/')}/metadata", recursive=True))
    files = [info for info in infos if info.type == fs.FileType.File]
    json_bytes = sum(info.size or 0 for info in files if info.path.endswith(".metadata.json"))
    return len(files), sum(info.size or 0 for info in files), json_bytes


def measure(
    catalog: Any,
    identifier: str,
    since: dt.datetime,
    repeat: int = 3,
    spark: Any = None,
    spark_catalog: str | None = None,
) -> TableHealth:
    """Every figure of one table; ``since`` bounds the filtered query (``ts >= since``)."""
    table = catalog.load_table(identifier)
    stats = data_file_stats(table)
    snapshot = table.current_snapshot()
    manifests = len(snapshot.manifests(table.io)) if snapshot is not None else 0
    metadata_files, metadata_bytes, metadata_json_bytes = metadata_footprint(table)
    row_filter = f"ts >= '{since.isoformat()}' AND country = '{FILTER_COUNTRY}'"
    filtered_rows = table.scan(row_filter=row_filter).to_arrow().num_rows
    scan_s = {
        "pyiceberg_count": median_s(lambda: catalog.load_table(identifier).scan().count(), repeat),
        "pyiceberg_filtered": median_s(
            lambda: catalog.load_table(identifier).scan(row_filter=row_filter).to_arrow(), repeat
        ),
    }
    if spark is not None and spark_catalog is not None:
        name = f"{spark_catalog}.{identifier}"
        spark.sql(f"REFRESH TABLE {name}")
        literal = since.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        filtered_sql = (
            f"SELECT count(*) FROM {name} WHERE ts >= TIMESTAMP '{literal}' AND country = '{FILTER_COUNTRY}'"
        )
        spark_filtered = spark.sql(filtered_sql).collect()[0][0]
        if spark_filtered != filtered_rows:
            raise AssertionError(
                f"{identifier}: Spark counts {spark_filtered} filtered rows, PyIceberg {filtered_rows}"
            )
        scan_s["spark_count"] = median_s(lambda: spark.sql(f"SELECT count(*) FROM {name}").collect(), repeat)
        scan_s["spark_filtered"] = median_s(lambda: spark.sql(filtered_sql).collect(), repeat)
    return TableHealth(
        table=identifier,
        rows=stats.records,
        filtered_rows=filtered_rows,
        data_files=stats.files,
        data_bytes=stats.bytes,
        snapshots=len(table.metadata.snapshots),
        manifests=manifests,
        live_manifests=live_manifests(table),
        metadata_files=metadata_files,
        metadata_bytes=metadata_bytes,
        metadata_json_bytes=metadata_json_bytes,
        scan_s=scan_s,
    )
