"""``fanout-sink sql --consistent``: each table of the sink as a temporary view at one round.

The point and each table's snapshot come from :func:`fanout_sink.consistent_read.latest_point`
(PyIceberg, before Spark starts: no point, no JVM). Each table becomes a temporary view named after
it (``orders``), ``SELECT * FROM <catalog>.<namespace>.<name> VERSION AS OF <snapshot>``, so a join
of the views never sees one table ahead of another; the table's own name still reads its current
snapshot. Two tables of one name in different namespaces get ``<namespace>_<name>`` views.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fanout_sink.consistent_read import ConsistentPoint


def view_names(identifiers: list[str]) -> dict[str, str]:
    """Per table identifier (``shop.orders``), its view's name: the table's own name, or with its
    namespace (``_``-joined) where two namespaces hold a table of that name."""
    names = Counter(identifier.rsplit(".", 1)[-1] for identifier in identifiers)
    return {
        identifier: identifier.rsplit(".", 1)[-1]
        if names[identifier.rsplit(".", 1)[-1]] == 1
        else identifier.replace(".", "_")
        for identifier in identifiers
    }


def _quoted(*parts: str) -> str:
    return ".".join("`" + part.replace("`", "``") + "`" for part in parts)


def statements(point: ConsistentPoint, catalog: str) -> dict[str, str]:
    """Per view name, the statement that registers its table at ``point`` (a table that held no row
    of the sink then: an empty view with the table's columns)."""
    found = {}
    for identifier, view in view_names(sorted(point.snapshots)).items():
        source = _quoted(catalog, *identifier.split("."))
        snapshot = point.snapshots[identifier]
        read = f"{source} VERSION AS OF {snapshot}" if snapshot is not None else f"{source} WHERE false"
        found[view] = f"CREATE OR REPLACE TEMPORARY VIEW {_quoted(view)} AS SELECT * FROM {read}"
    return found


def register(spark: Any, point: ConsistentPoint, catalog: str) -> str:
    """Register every table of ``point`` as a temporary view; the line that says what was registered."""
    for statement in statements(point, catalog).values():
        spark.sql(statement)
    views = view_names(sorted(point.snapshots))
    tables = ", ".join(
        f"{views[identifier]} = {identifier} @ {snapshot if snapshot is not None else 'empty'}"
        for identifier, snapshot in sorted(point.snapshots.items())
    )
    return (
        f"reading sink {point.sink!r} at round {point.commit_id} (control offset {point.control_offset}): "
        f"{tables}"
    )
