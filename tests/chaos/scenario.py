"""What the chaos sink is configured to do, and so what every record must become.

The config and the expectation sit side by side on purpose: a change of a route without the matching
change of ``expected_tables`` shows up as losses or duplicates in the verdict, never as silence.
Every record kind exercises something: orders and payments fan out to three tables (two static, one
dynamic and auto-created), clicks to three (one of them wide and finely partitioned), noise to none
(filtered), and malformed JSON is
dead-lettered. With change traffic on, the Debezium events of the change topic go to one change
table (``changes.ROUTE``; no append route takes them) and its tombstones are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import changes
from fanout_sink.catalog import CatalogSettings

# Static table -> the record types it takes; every routed type also goes to ``region.<region>``.
ROUTES = {
    "chaos.orders": ("order",),
    "chaos.payments": ("payment",),
    "chaos.money": ("order", "payment"),
    "chaos.clicks": ("click",),
    "chaos.wide": ("click",),
}
WIDE = "chaos.wide"
WIDE_COLUMNS = 300
WIDE_ROUTE = {
    "select": "{"
    + ", ".join(
        ["id: id", "seq: seq", *(f"c{i:03d}: {('seq', 'ts', 'page')[i % 3]}" for i in range(WIDE_COLUMNS))]
    )
    + "}",
    "partition-by": ["bucket[16](seq)"],
}
"""A wide, finely partitioned table: a click's 300 columns (numbers and strings, each with column
statistics) into 16 buckets, so a slice writes many files whose records outgrow one control message
(the run's control topic takes ``runner.CONTROL_MESSAGE_BYTES``) and its ``DataWritten`` events are
packed by size."""
NAMESPACES = ("chaos", "region")
MAINTENANCE = {
    "min-input-files": 2,
    "max-snapshot-age": "1m",
    "min-snapshots-to-keep": 1,
    "orphan-older-than": "5m",
}
"""What ``fanout-sink maintain`` does in the ``maintain`` kind: compaction from two small files on,
expiry of snapshots older than a minute, and of orphans older than five minutes (longer than any
attempt's write-to-commit, also on a slow box). No ``interval``: the app itself never maintains."""


def expected_tables(value: bytes) -> list[str] | None:
    """The tables a record lands in (empty: filtered); None when it is bad and must be dead-lettered."""
    try:
        body = json.loads(value)
    except ValueError:
        return None
    kind = body.get("type")
    tables = [name for name, kinds in ROUTES.items() if kind in kinds]
    return [*tables, f"region.{body['region']}"] if tables else []


def sink_config(
    name: str,
    bootstrap: str,
    topics: list[str],
    catalog: CatalogSettings,
    work_dir: Path,
    kafka: dict[str, Any] | None = None,
    change_table: bool = False,
    orphan_older_than: str | None = None,
) -> dict[str, Any]:
    """The sink's YAML; ``kafka`` adds properties to its ``kafka:`` section, ``change_table`` routes
    the change topic's events (``topics`` holds it) to the change table, ``orphan_older_than``
    replaces ``MAINTENANCE``'s orphan age (the ``catalog-stall`` kind's short one)."""
    tables: dict[str, Any] = {
        table: {"when": " || ".join(f"type == '{k}'" for k in kinds)} for table, kinds in ROUTES.items()
    }
    tables[WIDE].update(WIDE_ROUTE)
    if change_table:
        tables[changes.TABLE] = changes.ROUTE
    return {
        "name": name,
        "kafka": {"bootstrap.servers": bootstrap, **(kafka or {})},
        "source": {"topics": topics, "format": "json"},
        "control": {"topic": f"{name}-control", "commit-interval": "3s", "commit-timeout": "60s"},
        "catalog": catalog.model_dump(),
        "tables": tables,
        "dynamic": {
            "table": "join('.', ['region', region])",
            "allow": "^region\\.[a-z]+$",
            "auto-create": True,
            "applies-to": "all",
        },
        "unmatched": {"action": "drop"},
        "dead-letter": {"topic": f"{name}-dlq"},
        "errors": {"tolerance": "all"},
        "maintenance": {
            **MAINTENANCE,
            **({"orphan-older-than": orphan_older_than} if orphan_older_than else {}),
        },
        "spark": {
            "master": "local[2]",
            "checkpoint-location": str(work_dir / "checkpoints"),
            "max-offsets-per-trigger": 60000,
        },
    }
