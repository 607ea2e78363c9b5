"""The slice processor: decode -> route -> project -> (create/evolve table) -> convert.

``build_processor(config, catalog)`` returns a :data:`~fanout_sink.records.SliceProcessor` for the
worker. It never writes data files and never produces to Kafka: it returns rows per table in each
table's current Arrow schema, the dead letters to publish, and the count of deliberately filtered
records (skipped tombstones, unmatched records under ``unmatched.action: drop``).

Accounting (invariant I5): every record has one outcome per route -- a row in a table, or a dead
letter -- or, when it has no route, exactly one outcome: a dead letter or filtered. A change table
(``changes:``, :mod:`.changes`) adds two outcomes: a key's last change in the slice is a row or a
*delete*, its earlier changes are *superseded*. So ``records + extra routes == rows + deletes +
superseded + dead letters + filtered``, where a record routed to k tables has k - 1 extra routes.
:attr:`RoutingProcessor.last_stats` reports these numbers for each slice.

A Debezium truncate event (``op: t``) is never applied: emptying a replicated table is no step a
sink should take on one event it cannot undo, and a truncate followed by the slice's later changes
cannot be expressed as deletes of known keys. It is logged as a WARNING naming topic, partition,
offset and table, counted (``truncates``), and dead-lettered by policy when a dead-letter topic is
configured (kept for the operator, who truncates the table if wanted), else filtered.

With ``errors.tolerance: none`` the first bad record (lowest offset) raises
:class:`~fanout_sink.errors.RecordError` naming topic, partition, offset and the reason instead.
Dead letters by policy (``source.tombstones: dead-letter``, ``unmatched.action: dead-letter``) are
not errors: they are dead-lettered under either tolerance.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from fanout_sink.config.models import SinkConfig
from fanout_sink.config.tables import TableSettings
from fanout_sink.errors import RecordError, TableError, UnknownSchemaIdError
from fanout_sink.transform import deadletter
from fanout_sink.transform.changes import last_change_wins, message_key_columns, null_keys, read_changes
from fanout_sink.transform.convert import Matching, convert
from fanout_sink.transform.debezium import unwrap_connect_json
from fanout_sink.transform.expressions import Predicate, Projection
from fanout_sink.transform.formats import build_decoder
from fanout_sink.transform.formats.decoded import Decoded, Decoder
from fanout_sink.transform.formats.json import JsonDecoder
from fanout_sink.transform.formats.json_together import ParsedTogether
from fanout_sink.transform.record_view import RecordView
from fanout_sink.transform.records import RAW_RECORD_SCHEMA, RoutedSlice, TableRows
from fanout_sink.transform.routing import UNMATCHED_REASON, Router
from fanout_sink.transform.tables import TableKey, TableManager
from fanout_sink.transform.trace import SliceTrace

log = logging.getLogger(__name__)


@dataclass
class SliceStats:
    """Counts for one slice; ``records + extra_routes == rows + deletes + superseded + dead_letters
    + filtered``."""

    records: int = 0
    extra_routes: int = 0
    rows: int = 0
    dead_letters: int = 0
    filtered: int = 0
    deletes: int = 0
    """Change tables: keys whose last change in the slice deletes them (``TableRows.deleted_keys``)."""
    superseded: int = 0
    """Change tables: changes followed by a later change of the same key in the slice."""
    truncates: int = 0
    """Debezium truncate events seen (not applied); each is also a dead letter or filtered."""
    rows_per_table: dict[str, int] = field(default_factory=dict)
    deletes_per_table: dict[str, int] = field(default_factory=dict)
    truncated: list[tuple[int, str]] = field(default_factory=list)
    """(raw slice index, table) of each truncate event, for the warning naming it."""

    def reconciles(self) -> bool:
        outcomes = self.rows + self.deletes + self.superseded + self.dead_letters + self.filtered
        return self.records + self.extra_routes == outcomes


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
        self,
        config: SinkConfig,
        catalog: Catalog,
        vectorised: bool = True,
        decoder: Decoder | None = None,
        tables: TableManager | None = None,
    ) -> None:
        self.config = config
        self.vectorised = vectorised
        self.decoder = decoder if decoder is not None else build_decoder(config)
        self.router = Router(config, vectorised=vectorised)
        self.tables = tables if tables is not None else TableManager(catalog, config)
        self._projections: dict[str, Projection] = {}
        self._predicates: dict[str, Predicate] = {}
        declared = [t.changes for t in config.tables.values()]
        dynamic = [config.dynamic.changes] if config.dynamic is not None else []
        self.unwraps = any(c is not None and c.format == "debezium" for c in declared + dynamic)
        """Whether records in Kafka Connect's ``{"schema", "payload"}`` JSON wrapper are unwrapped."""
        self.last_stats = SliceStats()
        self.trace: SliceTrace | None = None
        """Told each record's outcome when set (``fanout-sink route``); the workers leave it None."""
        self._together = (
            ParsedTogether(self.decoder)
            if isinstance(self.decoder, JsonDecoder) and not self.decoder.per_record
            else None
        )

    def _projection(self, expression: str) -> Projection:
        found = self._projections.get(expression)
        if found is None:
            found = self._projections[expression] = Projection(expression)
        return found

    def prepare(self, raws: Sequence[pa.Table]) -> None:
        """The raw slices (or chunks) this processor is called with next, in that order: a JSON decoder
        parses their values together (:mod:`.formats.json_together`), each call then takes its share."""
        if self._together is not None:
            self._together.prepare([_values(raw).drop_null() for raw in raws])

    def __call__(self, raw: pa.Table) -> RoutedSlice:
        if raw.schema.names != RAW_RECORD_SCHEMA.names:
            raw = raw.select(RAW_RECORD_SCHEMA.names)
        n = raw.num_rows
        out = RoutedSlice(table_changed=self.tables.replace)
        stats = SliceStats(records=n)
        failures: list[_Failure] = []
        values = _values(raw)
        tombstone = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if tombstone.any():
            if self.config.source.tombstones == "skip":
                out.filtered += int(tombstone.sum())
                if self.trace is not None:
                    self.trace.filtered(
                        np.flatnonzero(tombstone), "tombstone (null value): source.tombstones is skip"
                    )
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
        # Connect's JSON wrapper is unwrapped from whole records: routing reads the event inside.
        fields = None if self.unwraps else self.router.fields
        batch = values.take(pa.array(present, pa.int64()))
        try:
            shared = self._together.take(batch) if self._together is not None and len(batch) else None
            decoded = shared if shared is not None else self.decoder(batch, fields)
        except UnknownSchemaIdError as exc:
            row = raw.slice(int(present[exc.first]), 1).to_pylist()[0]
            raise exc.at(f"{row['topic']}[{row['partition']}]@{row['offset']}") from None
        if self.unwraps:
            decoded = unwrap_connect_json(decoded)
        failures.extend(_Failure(int(present[i]), "decode", reason) for i, reason in decoded.failures)
        decoded = decoded.with_rows(present[decoded.rows] if len(decoded.rows) else decoded.rows)
        view = RecordView.build(decoded, raw)
        routes = self.router.route(view)
        out.filtered += routes.dropped
        if self.trace is not None:
            self.trace.routed(decoded.rows, routes, "no table matched the record (unmatched.action is drop)")
        view.decoded.expect(routes.tables)
        route_counts = np.zeros(len(view), dtype=np.int64)
        for pos, reason in routes.dead:
            policy = reason == UNMATCHED_REASON
            failures.append(_Failure(int(decoded.rows[pos]), "route", reason, policy=policy))
            route_counts[pos] += 1
        for pos, table, reason in routes.failed:
            failures.append(_Failure(int(decoded.rows[pos]), "route", reason, table=table))
            route_counts[pos] += 1
        for name, positions in routes.tables.items():
            route_counts[positions] += 1
            self._to_table(name, positions, view, decoded, out, failures, stats)
        self._warn_truncates(raw, stats.truncated)
        stats.extra_routes = int(np.maximum(route_counts - 1, 0).sum())
        if self.trace is not None:
            for f in failures:
                self.trace.failed(f.index, f.stage, f.reason, f.table, f.column, f.policy)
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
        stats.deletes_per_table = {
            name: rows.deleted_keys.num_rows
            for name, rows in out.tables.items()
            if rows.deleted_keys is not None
        }
        stats.deletes = sum(stats.deletes_per_table.values())
        stats.truncates = len(stats.truncated)
        self.last_stats = stats
        return out

    def _warn_truncates(self, raw: pa.Table, truncated: list[tuple[int, str]]) -> None:
        if not truncated:
            return
        rows = (
            raw.select(["topic", "partition", "offset"]).take(pa.array([i for i, _ in truncated])).to_pylist()
        )
        where = "; the event is in the dead-letter topic" if self.config.dead_letter is not None else ""
        for row, (_, table) in zip(rows, truncated, strict=True):
            log.warning(
                "table %s: truncate event %s[%s]@%s not applied: the table keeps its rows; truncate it "
                "yourself if the source's truncation should reach it%s",
                table,
                row["topic"],
                row["partition"],
                row["offset"],
                where,
            )

    def _predicate(self, expression: str) -> Predicate:
        found = self._predicates.get(expression)
        if found is None:
            found = self._predicates[expression] = Predicate(expression)
        return found

    def _connect_classes(self) -> dict[str, str] | None:
        """Per stage, the class that failed on a record (Kafka Connect's ``class.name`` header), when
        ``dead-letter.connect-headers`` asks for Connect's headers."""
        if self.config.dead_letter is None or not self.config.dead_letter.connect_headers:
            return None
        decoder, router, processor = (
            f"{type(o).__module__}.{type(o).__qualname__}" for o in (self.decoder, self.router, self)
        )
        return {
            "decode": decoder,
            "route": router,
            "convert": processor,
            "tombstone": processor,
            "truncate": processor,
        }

    def _to_table(
        self,
        name: str,
        positions: np.ndarray,
        view: RecordView,
        decoded: Decoded,
        out: RoutedSlice,
        failures: list[_Failure],
        stats: SliceStats,
    ) -> None:
        settings = self.tables.settings_for(name)
        # The table's records with every field: parsed now when routing saw only its fields.
        sub = view.subset(positions, name)
        failures.extend(
            _Failure(int(decoded.rows[p]), "decode", reason, table=name) for p, reason in sub.decoded.failures
        )
        origins = decoded.rows[sub.decoded.rows]  # each of sub's records' index in the raw slice
        if settings.changes is not None:
            self._changes_to_table(name, settings, sub, origins, out, failures, stats)
            return
        rows, kept = self._project(name, settings, sub, origins, failures)
        origin = origins[kept]
        if rows.num_rows == 0:
            return
        table = self._table(name, settings, rows, sub, origin, failures)
        if table is None:
            return
        table = self.tables.evolve(name, table, rows, settings)
        converted = convert(rows, self.tables.arrow_schema(table), Matching.of(settings.conversion))
        failures.extend(
            _Failure(int(origin[pos]), "convert", reason, table=name, column=column)
            for pos, column, reason in converted.failures
        )
        if converted.rows.num_rows:
            out.tables[name] = TableRows(table=table, rows=converted.rows)
            if self.trace is not None:
                self.trace.rows(name, origin[converted.positions])

    def _project(
        self,
        name: str,
        settings: TableSettings,
        view: RecordView,
        origins: np.ndarray,
        failures: list[_Failure],
    ) -> tuple[pa.Table, np.ndarray]:
        """The table's rows from ``view`` (``select``, or the records as they are) and the view
        positions they came from; ``origins`` are the view's records' indices in the raw slice."""
        if settings.select is None:
            return view.records, np.arange(len(view))
        rows, kept, bad = self._projection(settings.select).apply(view, np.arange(len(view)), self.vectorised)
        failures.extend(_Failure(int(origins[p]), "route", r, table=name) for p, r in bad)
        return rows, kept

    def _table(
        self,
        name: str,
        settings: TableSettings,
        rows: pa.Table,
        view: RecordView,
        origin: np.ndarray,
        failures: list[_Failure],
        key: tuple[str, ...] | None = None,
    ) -> Table | None:
        """The table, loaded or created from ``rows``; ``None`` when a dynamic table cannot be (its
        records, whose raw indices are ``origin``, are then dead letters). A change table's ``key``
        is its identifier fields (checked, or set on create)."""
        try:
            # A projection names the table's fields; without one, the records' own fields do.
            carried = view.decoded.carries if settings.select is None else None
            table_key = None if key is None else TableKey.configured(name, self.config, key)
            return self.tables.ensure(name, settings, sample=rows, carried=carried, key=table_key)
        except TableError as exc:
            if name in self.config.tables:
                raise
            failures.extend(_Failure(int(i), "route", str(exc), table=name) for i in origin)
            return None

    def _changes_to_table(
        self,
        name: str,
        settings: TableSettings,
        sub: RecordView,
        origins: np.ndarray,
        out: RoutedSlice,
        failures: list[_Failure],
        stats: SliceStats,
    ) -> None:
        """A change table's slice: each key's last change, as rows (upserts) and deleted keys."""
        assert settings.changes is not None
        if settings.changes.key is not None:
            key = tuple(settings.changes.key)
        else:
            key, keyless_messages = message_key_columns(sub, self.tables.identifier_fields(name))
            failures.extend(_Failure(int(origins[p]), "decode", r, table=name) for p, r in keyless_messages)
            if keyless_messages:
                keep = _all_but(len(sub), [p for p, _ in keyless_messages])
                sub, origins = sub.subset(np.flatnonzero(keep)), origins[keep]
        delete_when = settings.changes.delete_when
        predicate = self._predicate(delete_when) if delete_when is not None else None
        changes = read_changes(sub, settings.changes, predicate, self.vectorised)
        failures.extend(_Failure(int(origins[p]), "decode", r, table=name) for p, r in changes.bad)
        self._truncated(name, origins[changes.truncates], out, failures, stats)
        image_origins = origins[changes.positions]
        rows, kept = self._project(name, settings, changes.images, image_origins, failures)
        origin, deleting = image_origins[kept], changes.deletes[kept]
        matching = Matching.of(settings.conversion)
        keyless = null_keys(rows, key, matching)
        failures.extend(_Failure(int(origin[p]), "convert", r, table=name, column=c) for p, c, r in keyless)
        if keyless:
            keep = _all_but(rows.num_rows, [p for p, _, _ in keyless])
            rows, origin, deleting = rows.filter(pa.array(keep)), origin[keep], deleting[keep]
        if rows.num_rows == 0:
            return
        upserts, deletes = rows.filter(pa.array(~deleting)), rows.filter(pa.array(deleting))
        upsert_origin, delete_origin = origin[~deleting], origin[deleting]
        sample = upserts if upserts.num_rows else rows
        table = self._table(name, settings, sample, changes.images, origin, failures, key)
        if table is None:
            return
        if upserts.num_rows:
            table = self.tables.evolve(name, table, upserts, settings)
        schema = self.tables.arrow_schema(table)
        converted = convert(upserts, schema, matching)
        keys = convert(deletes, pa.schema([schema.field(k) for k in key]), matching)
        for part, part_origin in ((converted, upsert_origin), (keys, delete_origin)):
            failures.extend(
                _Failure(int(part_origin[pos]), "convert", reason, table=name, column=column)
                for pos, column, reason in part.failures
            )
        upsert_order, delete_order = upsert_origin[converted.positions], delete_origin[keys.positions]
        won, deleted = last_change_wins(converted.rows.select(key), upsert_order, keys.rows, delete_order)
        stats.superseded += len(upsert_order) + len(delete_order) - len(won) - len(deleted)
        if self.trace is not None:
            kept = np.concatenate([upsert_order[won], delete_order[deleted]])
            self.trace.rows(name, upsert_order[won])
            self.trace.deletes(name, delete_order[deleted])
            self.trace.superseded(name, np.setdiff1d(np.concatenate([upsert_order, delete_order]), kept))
        if len(won) or len(deleted):
            out.tables[name] = TableRows(
                table=table,
                rows=converted.rows.take(pa.array(won, pa.int64())),
                key=key,
                deleted_keys=keys.rows.take(pa.array(deleted, pa.int64())) if len(deleted) else None,
            )

    def _truncated(
        self, name: str, origin: np.ndarray, out: RoutedSlice, failures: list[_Failure], stats: SliceStats
    ) -> None:
        """Debezium truncate events: never applied (see the module's docstring)."""
        if not len(origin):
            return
        stats.truncated.extend((int(i), name) for i in origin)
        reason = "truncate event (op t) not applied: the sink never empties a table on its own"
        if self.config.dead_letter is None:
            out.filtered += len(origin)
            if self.trace is not None:
                self.trace.filtered(origin, reason, table=name)
            return
        failures.extend(_Failure(int(i), "truncate", reason, table=name, policy=True) for i in origin)


def _values(raw: pa.Table) -> pa.Array:
    """A raw slice's values as one array."""
    return raw.column("value").combine_chunks()


def _all_but(n: int, positions: list[int]) -> np.ndarray:
    """A mask of ``n`` rows keeping all but ``positions``."""
    keep = np.ones(n, dtype=bool)
    keep[positions] = False
    return keep


def build_processor(config: SinkConfig, catalog: Catalog, vectorised: bool = True) -> RoutingProcessor:
    """The :data:`~fanout_sink.records.SliceProcessor` for a :class:`~fanout_sink.config.models.SinkConfig`.

    ``vectorised=False`` forces every expression through jmespath per record (for comparison).
    """
    return RoutingProcessor(config, catalog, vectorised=vectorised)
