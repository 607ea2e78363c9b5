"""The slice processor: decode -> route -> project -> (create/evolve table) -> convert.

``build_processor(config, catalog)`` returns a :data:`~fanout_sink.records.SliceProcessor` for the
worker. It never writes data files and never produces to Kafka: it returns rows per table in each
table's current Arrow schema, the dead letters to publish, and the count of deliberately filtered
records (skipped tombstones, unmatched records under ``unmatched.action: drop``).

Accounting (invariant I5): every record has one outcome per route -- a row in a table, or a dead
letter -- or, when it has no route, exactly one outcome: a dead letter or filtered. So
``records + extra routes == rows + dead letters + filtered``, where a record routed to k tables has
k - 1 extra routes. :attr:`RoutingProcessor.last_stats` reports these numbers for each slice.

With ``errors.tolerance: none`` the first bad record (lowest offset) raises
:class:`~fanout_sink.errors.RecordError` naming topic, partition, offset and the reason instead.
Dead letters by policy (``source.tombstones: dead-letter``, ``unmatched.action: dead-letter``) are
not errors: they are dead-lettered under either tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import RecordError, TableError
from fanout_sink.transform import deadletter
from fanout_sink.transform.convert import Matching, convert
from fanout_sink.transform.expressions import Projection, RecordView
from fanout_sink.transform.formats import build_decoder
from fanout_sink.transform.formats.decoded import Decoded, Decoder
from fanout_sink.transform.records import RAW_RECORD_SCHEMA, RoutedSlice, TableRows
from fanout_sink.transform.routing import UNMATCHED_REASON, Router
from fanout_sink.transform.tables import TableManager


@dataclass
class SliceStats:
    """Counts for one slice; ``records + extra_routes == rows + dead_letters + filtered``."""

    records: int = 0
    extra_routes: int = 0
    rows: int = 0
    dead_letters: int = 0
    filtered: int = 0
    rows_per_table: dict[str, int] = field(default_factory=dict)

    def reconciles(self) -> bool:
        return self.records + self.extra_routes == self.rows + self.dead_letters + self.filtered


@dataclass(frozen=True)
class _Failure:
    index: int  # row of the raw slice
    stage: str
    reason: str
    table: str | None = None
    column: str | None = None
    policy: bool = False
    """Dead-lettered by configuration (tombstones, unmatched), not because the record is bad."""


class RoutingProcessor:
    """Callable :data:`SliceProcessor`; one per process (it caches tables, schemas, names)."""

    def __init__(
        self, config: SinkConfig, catalog: Catalog, vectorised: bool = True, decoder: Decoder | None = None
    ) -> None:
        self.config = config
        self.vectorised = vectorised
        self.decoder = decoder if decoder is not None else build_decoder(config)
        self.router = Router(config, vectorised=vectorised)
        self.tables = TableManager(catalog, config)
        self._projections: dict[str, Projection] = {}
        self.last_stats = SliceStats()

    def _projection(self, expression: str) -> Projection:
        found = self._projections.get(expression)
        if found is None:
            found = self._projections[expression] = Projection(expression)
        return found

    def __call__(self, raw: pa.Table) -> RoutedSlice:
        if raw.schema.names != RAW_RECORD_SCHEMA.names:
            raw = raw.select(RAW_RECORD_SCHEMA.names)
        n = raw.num_rows
        out = RoutedSlice(table_changed=self.tables.replace)
        stats = SliceStats(records=n)
        failures: list[_Failure] = []
        values = raw.column("value").combine_chunks()
        tombstone = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if tombstone.any():
            if self.config.source.tombstones == "skip":
                out.filtered += int(tombstone.sum())
            else:
                failures.extend(
                    _Failure(
                        int(i),
                        "tombstone",
                        "tombstone (null value) and source.tombstones is dead-letter",
                        policy=True,
                    )
                    for i in np.flatnonzero(tombstone)
                )
        present = np.flatnonzero(~tombstone)
        decoded = self.decoder(values.take(pa.array(present, pa.int64())), self.router.fields)
        failures.extend(_Failure(int(present[i]), "decode", reason) for i, reason in decoded.failures)
        decoded = decoded.with_rows(present[decoded.rows] if len(decoded.rows) else decoded.rows)
        view = RecordView.build(decoded, raw)
        routes = self.router.route(view)
        out.filtered += routes.dropped
        route_counts = np.zeros(len(view), dtype=np.int64)
        for pos, reason in routes.dead:
            policy = reason == UNMATCHED_REASON
            failures.append(_Failure(int(decoded.rows[pos]), "route", reason, policy=policy))
            route_counts[pos] += 1
        for name, positions in routes.tables.items():
            route_counts[positions] += 1
            self._to_table(name, positions, view, decoded, out, failures)
        stats.extra_routes = int(np.maximum(route_counts - 1, 0).sum())
        errors = [f for f in failures if not f.policy]
        if errors and self.config.errors.tolerance == "none":
            first = min(errors, key=lambda f: f.index)
            row = raw.slice(first.index, 1).to_pylist()[0]
            reason = first.reason if first.table is None else f"{first.reason} (table {first.table})"
            raise RecordError(row["topic"], row["partition"], row["offset"], first.stage, reason)
        if failures:
            failures.sort(key=lambda f: (f.index, f.table or ""))
            indices = pa.array([f.index for f in failures], pa.int64())
            rows = raw.take(indices).to_pylist()
            executing = self._connect_classes()
            out.dead_letters = [
                deadletter.dead_letter(
                    row,
                    sink=self.config.name,
                    stage=f.stage,
                    reason=f.reason,
                    table=f.table,
                    column=f.column,
                    connect_class=executing[f.stage] if executing else None,
                )
                for row, f in zip(rows, failures, strict=True)
            ]
        stats.dead_letters = len(out.dead_letters)
        stats.filtered = out.filtered
        stats.rows_per_table = {name: rows.rows.num_rows for name, rows in out.tables.items()}
        stats.rows = sum(stats.rows_per_table.values())
        self.last_stats = stats
        return out

    def _connect_classes(self) -> dict[str, str] | None:
        """Per stage, the class that failed on a record (Kafka Connect's ``class.name`` header), when
        ``dead-letter.connect-headers`` asks for Connect's headers."""
        if self.config.dead_letter is None or not self.config.dead_letter.connect_headers:
            return None
        decoder, router, processor = (
            f"{type(o).__module__}.{type(o).__qualname__}" for o in (self.decoder, self.router, self)
        )
        return {"decode": decoder, "route": router, "convert": processor, "tombstone": processor}

    def _to_table(
        self,
        name: str,
        positions: np.ndarray,
        view: RecordView,
        decoded: Decoded,
        out: RoutedSlice,
        failures: list[_Failure],
    ) -> None:
        settings = self.tables.settings_for(name)
        # The table's records with every field: parsed now when routing saw only its fields.
        sub = view.subset(positions, name)
        failures.extend(
            _Failure(int(decoded.rows[p]), "decode", reason, table=name) for p, reason in sub.decoded.failures
        )
        local = np.arange(len(sub))
        if settings.select is not None:
            rows, kept, bad = self._projection(settings.select).apply(sub, local, self.vectorised)
            failures.extend(
                _Failure(int(decoded.rows[sub.decoded.rows[p]]), "route", r, table=name) for p, r in bad
            )
        else:
            rows, kept = sub.records, local
        origin = decoded.rows[sub.decoded.rows[kept]]  # each row's index in the raw slice
        if rows.num_rows == 0:
            return
        is_dynamic = name not in self.config.tables
        try:
            # A projection names the table's fields; without one, the records' own fields do.
            carried = sub.decoded.carries if settings.select is None else None
            table = self.tables.ensure(name, settings, sample=rows, carried=carried)
        except TableError as exc:
            if not is_dynamic:
                raise
            failures.extend(_Failure(int(i), "route", str(exc), table=name) for i in origin)
            return
        table = self.tables.evolve(name, table, rows, settings)
        converted = convert(rows, table.schema().as_arrow(), Matching.of(settings.conversion))
        failures.extend(
            _Failure(int(origin[pos]), "convert", reason, table=name, column=column)
            for pos, column, reason in converted.failures
        )
        if converted.rows.num_rows:
            out.tables[name] = TableRows(table=table, rows=converted.rows)


def build_processor(config: SinkConfig, catalog: Catalog, vectorised: bool = True) -> RoutingProcessor:
    """The :data:`~fanout_sink.records.SliceProcessor` for a :class:`~fanout_sink.config.models.SinkConfig`.

    ``vectorised=False`` forces every expression through jmespath per record (for comparison).
    """
    return RoutingProcessor(config, catalog, vectorised=vectorised)
