"""What a run would make of some records: per record its tables, rows, dead letters and filters; per
table the columns it would have. Nothing is written: no table, catalog file, topic or offset.

The records go through the workers' own :class:`~fanout_sink.transform.processor.RoutingProcessor`
(decode, route, ``select``, table create/evolve, convert), one call per topic-partition slice in
chunks of ``spark.max-records-per-batch`` as a worker makes them, with two differences that change
no outcome: tables are :class:`~fanout_sink.transform.planned_tables.PlannedTables` (created and
evolved in memory), and ``errors.tolerance`` is ``all`` inside, so that a record that would stop a
sink under ``none`` is shown among the others, marked as the stop it would be, instead of ending the
preview at the first one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog

from fanout_sink.catalog import load_catalog, sqlite_path
from fanout_sink.catalog_errors import unreachable
from fanout_sink.config.models import SinkConfig
from fanout_sink.config.topics import ErrorSettings
from fanout_sink.errors import FanoutSinkError
from fanout_sink.route.last_records import read_last
from fanout_sink.route.samples import read_sample
from fanout_sink.transform.planned_tables import PlannedTables
from fanout_sink.transform.processor import RoutingProcessor
from fanout_sink.transform.trace import Outcome, SliceTrace


@dataclass
class RecordLine:
    """One record: where it came from, what became of it, and its row per table it lands in."""

    topic: str
    partition: int
    offset: int
    outcomes: list[Outcome]
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    stops: bool = False
    """A bad record under ``errors.tolerance: none``: the run would stop here (``RecordError``)."""


@dataclass
class TableLine:
    """One table the records reach: created or existing, its columns after them, its counts."""

    name: str
    created: bool
    columns: list[tuple[str, str, bool]]
    """(name, Iceberg type, required) in schema order."""
    added: list[str]
    changes: list[str]
    rows: int = 0
    deletes: int = 0
    dead_letters: int = 0


@dataclass
class Preview:
    records: list[RecordLine]
    tables: dict[str, TableLine]
    tolerance: str
    dead_letter_topic: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def stops(self) -> list[RecordLine]:
        return [r for r in self.records if r.stops]


def open_catalog(config: SinkConfig) -> tuple[Catalog, list[str]]:
    """The sink's catalog, read-only; an empty in-memory one (and a note saying so) when its SQLite
    file does not exist yet, so that no catalog file is made by a preview."""
    settings = config.catalog
    path = sqlite_path(settings.uri) if settings.type == "sql" and settings.uri else None
    if path is not None and not path.exists():
        from pyiceberg.catalog.sql import SqlCatalog

        note = f"catalog {settings.name!r}: {path} does not exist yet, so every table would be created"
        return SqlCatalog(settings.name, uri="sqlite:///:memory:", warehouse="planned://"), [note]
    try:
        return load_catalog(settings, create=False), []
    except FanoutSinkError:
        raise
    except Exception as exc:  # the catalog's own errors (HTTP, SQL)
        raise FanoutSinkError(
            f"catalog {settings.name!r} is not reachable: {unreachable(exc)}; check catalog.uri and the "
            "catalog's credentials in the catalog: section"
        ) from None


def preview(
    config: SinkConfig, slices: list[pa.Table], catalog: Catalog, notes: list[str] | None = None
) -> Preview:
    """Every record of ``slices`` (raw, one topic-partition each) through the workers' processor."""
    inside = config.model_copy(update={"errors": ErrorSettings(tolerance="all")})
    tables = PlannedTables(catalog, inside)
    processor = RoutingProcessor(inside, catalog, tables=tables)
    records: list[RecordLine] = []
    lines: dict[str, TableLine] = {}
    tolerance = config.errors.tolerance or "none"
    chunk = config.spark.max_records_per_batch
    for raw in slices:
        for start in range(0, raw.num_rows, chunk):
            part = raw.slice(start, chunk)
            trace = processor.trace = SliceTrace()
            routed = processor(part)
            coordinates = part.select(["topic", "partition", "offset"]).to_pylist()
            chunk_lines = [
                RecordLine(c["topic"], c["partition"], c["offset"], trace.outcomes.get(i, []))
                for i, c in enumerate(coordinates)
            ]
            for name, table_rows in routed.tables.items():
                for origin, row in zip(
                    trace.row_origins[name].tolist(), table_rows.rows.to_pylist(), strict=True
                ):
                    chunk_lines[origin].rows[name] = row
                line = lines.get(name) or _table_line(name, table_rows.table, tables)
                lines[name] = line
                line.rows += table_rows.rows.num_rows
                if table_rows.deleted_keys is not None:
                    line.deletes += table_rows.deleted_keys.num_rows
            for record in chunk_lines:
                for outcome in record.outcomes:
                    if outcome.kind == "dead-letter" and not outcome.policy and tolerance == "none":
                        record.stops = True
                    if outcome.kind == "dead-letter" and outcome.table is not None:
                        table = tables.cached(outcome.table)
                        if outcome.table not in lines and table is not None:
                            lines[outcome.table] = _table_line(outcome.table, table, tables)
                        if outcome.table in lines:
                            lines[outcome.table].dead_letters += 1
            records += chunk_lines
    for name, line in lines.items():  # the columns after every chunk's schema changes
        final = tables.cached(name)
        if final is not None:
            lines[name] = _table_line(name, final, tables, line)
    dead_letter_topic = config.dead_letter.topic if config.dead_letter is not None else None
    return Preview(records, dict(sorted(lines.items())), tolerance, dead_letter_topic, notes or [])


def preview_records(config: SinkConfig, sample: Path | None, topic: str | None, last: int) -> Preview:
    """``fanout-sink route``: the records of the ``sample`` file, or the last ``last`` offsets of each
    partition of ``topic``, previewed against the sink's catalog."""
    catalog, notes = open_catalog(config)
    if sample is not None:
        slices = read_sample(sample, config.source.topics[0] if config.source.topics else "sample")
    else:
        assert topic is not None
        slices = read_last(config, topic, last)
    return preview(config, slices, catalog, notes)


def _table_line(name: str, table: Any, tables: PlannedTables, counts: TableLine | None = None) -> TableLine:
    plan = tables.plans.get(name)
    columns = [(f.name, str(f.field_type), f.required) for f in table.schema().fields]
    line = TableLine(
        name,
        created=plan is not None and plan.created,
        columns=columns,
        added=plan.added if plan is not None else [],
        changes=plan.changes if plan is not None else [],
    )
    if counts is not None:
        line.rows, line.deletes, line.dead_letters = counts.rows, counts.deletes, counts.dead_letters
    return line
