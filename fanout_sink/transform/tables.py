"""Destination tables: load, auto-create and evolve, with retries when workers race.

A :class:`TableManager` keeps a per-process cache of loaded tables. ``ensure`` loads a table or
(when ``auto-create`` is on) creates it: from the Avro schema file named by the table's ``schema``
key, or else from the first rows routed to it, by the rules of :mod:`.inference` (only fields the
table's own records carry, every column optional, time fields as timestamps). The partition spec
(``partition-by``) and ``properties`` are applied in the same transaction as the create.

``evolve`` compares incoming rows with the table schema and, as the table's ``evolution`` settings
allow, adds columns (top-level, and fields of struct columns; not yet inside lists or maps; typed
by the same rules, and only once a row has a value for them),
widens ``int`` to ``long`` and ``float`` to ``double`` when values do not fit, and makes a
required column optional when rows lack it. On a commit conflict it
reloads the table and recomputes the change against the new schema, so several workers evolving
one table converge on one schema; a change that another worker already made is a no-op.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.spec import UpdateSpec
from pyiceberg.types import DoubleType, LongType

from fanout_sink.avro_schema import avro_to_arrow_schema, load_avro_schema
from fanout_sink.config.models import SinkConfig
from fanout_sink.config.tables import TableSettings
from fanout_sink.errors import FanoutSinkError, TableError
from fanout_sink.pyiceberg_internals import arrow_writes, sql_catalog
from fanout_sink.retries import Retry
from fanout_sink.transform.convert import Matching
from fanout_sink.transform.inference import Carried, Inference

log = logging.getLogger(__name__)


@dataclass
class SchemaChanges:
    adds: list[pa.Field] = field(default_factory=list)
    """Top-level fields to add, or existing structs carrying only their new children."""
    widen: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    optional: list[tuple[str, ...]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.adds or self.widen or self.optional)

    def describe(self) -> str:
        parts = [f"add {f.name}" for f in self.adds]
        parts += [f"widen {'.'.join(p)} to {t}" for p, t in self.widen]
        parts += [f"make {'.'.join(p)} optional" for p in self.optional]
        return ", ".join(parts)


def _fits_int32(array: pa.Array) -> bool:
    if array.null_count == len(array):
        return True
    bounds = pc.min_max(array)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return bool(low >= -(2**31) and high < 2**31)


def _fits_float32(array: pa.Array) -> bool:
    values = array.to_numpy(zero_copy_only=False)
    values = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    return bool(np.array_equal(values.astype(np.float32).astype(np.float64), values))


def _diff(
    target: pa.Schema | pa.DataType,
    rows: pa.Table | pa.Array,
    settings: TableSettings,
    matching: Matching,
    inference: Inference,
    prefix: tuple[str, ...] = (),
) -> SchemaChanges:
    changes = SchemaChanges()
    evolution = settings.evolution
    if isinstance(rows, pa.Table):
        names = rows.column_names
        n = rows.num_rows
    else:
        names = [rows.type.field(i).name for i in range(rows.type.num_fields)]
        n = len(rows)
    target_fields = list(target)

    def get(name: str) -> pa.Array:
        if isinstance(rows, pa.Table):
            return rows.column(name).combine_chunks()
        # By position: Arrow reads a name that starts with "." or "[" as a path ("." failed as a
        # JSON key nested in a struct), and a record's keys can be any text.
        return pc.struct_field(rows, [names.index(name)])

    matched: set[str] = set()
    for tf in target_fields:
        path = (*prefix, tf.name)
        source = matching.find(names, tf.name, ".".join(path))
        if source is None:
            if not tf.nullable and evolution.make_optional and n:
                changes.optional.append(path)
            continue
        matched.add(source)
        column = get(source)
        dtype = column.type
        if pa.types.is_struct(tf.type) and pa.types.is_struct(dtype):
            nested = _diff(tf.type, column, settings, matching, inference, path)
            changes.widen += nested.widen
            changes.optional += nested.optional
            if nested.adds:
                changes.adds.append(pa.field(tf.name, pa.struct(nested.adds), nullable=tf.nullable))
        elif evolution.widen_types and pa.types.is_int32(tf.type) and pa.types.is_integer(dtype):
            if dtype.bit_width > 32 and not _fits_int32(column):
                changes.widen.append((path, "long"))
        elif evolution.widen_types and pa.types.is_float32(tf.type) and pa.types.is_float64(dtype):
            if not _fits_float32(column):
                changes.widen.append((path, "double"))
        if not tf.nullable and evolution.make_optional and column.null_count:
            changes.optional.append(path)
    if evolution.add_columns:
        for name in names:
            if name in matched or any(
                m.lower() == name.lower() for m in matched if matching.case_insensitive
            ):
                continue
            # Null in every row: nothing to learn a type from yet, or (rows parsed with the whole
            # batch) a field only other tables' records carry. It is added when a value comes.
            added = inference.column(name, get(name))
            if added is not None:
                changes.adds.append(added)
    return changes


def stage_schema_changes(update: UpdateSchema, changes: SchemaChanges) -> None:
    """``changes`` as steps of a schema update (committed by the caller's ``with``)."""
    if changes.adds:
        update.union_by_name(pa.schema(changes.adds))
    for path, kind in changes.widen:
        update.update_column(path, LongType() if kind == "long" else DoubleType())
    for path in changes.optional:
        update.make_column_optional(path)


def stage_partition_spec(update: UpdateSpec, settings: TableSettings) -> None:
    """A new table's ``partition-by`` as steps of a spec update (committed by the caller's ``with``)."""
    for part in settings.partition_by:
        transform = part.transform if part.argument is None else f"{part.transform}[{part.argument}]"
        update.add_field(part.column, transform)


@dataclass(frozen=True)
class TableKey:
    """A change table's key columns and where they were decided, for the errors that name it."""

    columns: tuple[str, ...]
    origin: str
    """The YAML path of the key (``tables."crm.customers".changes.key``), or the message keys."""

    @classmethod
    def configured(cls, name: str, config: SinkConfig, columns: tuple[str, ...]) -> TableKey:
        """A key set by ``changes.key`` (or, with no key set, taken from the Kafka message keys)."""
        declared = name in config.tables
        section = f'tables."{name}".changes' if declared else "dynamic.changes"
        settings = config.tables[name] if declared else None
        changes = settings.changes if settings is not None else None
        if changes is None and config.dynamic is not None:
            changes = config.dynamic.changes
        if changes is not None and changes.key is None:
            return cls(columns, f"the Kafka message keys' fields ({section}.key is unset)")
        return cls(columns, f"{section}.key")


def _key_type_problem(dtype: pa.DataType) -> str | None:
    if pa.types.is_nested(dtype):
        return f"is a {dtype}, not a primitive column"
    if pa.types.is_floating(dtype):
        return f"is a {dtype}: Iceberg does not allow floating-point identifier fields"
    if pa.types.is_null(dtype):
        return "has no type yet (null in every first row)"
    return None


def iceberg_schema(name: str, schema: pa.Schema, key: TableKey | None) -> Schema | pa.Schema:
    """The schema a new table is created with: an append table's as it is; a change table's with
    its key columns required and as its identifier fields (how Iceberg, Spark's MERGE and readers
    know a row's key)."""
    if key is None:
        return schema
    fields = []
    for column in schema:
        if column.name in key.columns:
            problem = _key_type_problem(column.type)
            if problem is not None:
                raise TableError(
                    f"table {name}: key column {column.name!r} {problem}; the key ({key.origin}) must "
                    "name top-level primitive columns (e.g. integers, strings, dates)"
                )
        fields.append(column.with_nullable(False) if column.name in key.columns else column)
    missing = [k for k in key.columns if k not in schema.names]
    if missing:
        raise TableError(
            f"table {name}: key column(s) {missing} are not among its columns {schema.names}; "
            f"fix the key ({key.origin}) or select the key columns"
        )
    converted = assign_fresh_schema_ids(arrow_writes.schema_from_arrow(pa.schema(fields)))
    ids = [converted.find_field(k).field_id for k in key.columns]
    return Schema(*converted.fields, identifier_field_ids=ids)


def check_key(name: str, table: Table, key: TableKey | None) -> None:
    """Raise :class:`TableError` when an existing table's identifier fields are not the key.

    The key decides which row a change replaces; a table keyed otherwise (or not at all) would be
    changed by the wrong rows, so the sink stops instead of guessing.
    """
    if key is None:
        return
    have = sorted(table.schema().identifier_field_names())
    if have == sorted(key.columns):
        return
    wanted = list(key.columns)
    if not have:
        raise TableError(
            f"table {name} exists without identifier fields, but its key is {wanted} ({key.origin}); "
            f"make them its identifier fields (Spark SQL: ALTER TABLE {name} SET IDENTIFIER FIELDS "
            f"{', '.join(wanted)}; the columns must be required), or change the key"
        )
    raise TableError(
        f"table {name} has identifier fields {have}, but its key is {wanted} ({key.origin}); make "
        f"them agree: change the key to {have}, or the table's identifier fields (Spark SQL: ALTER "
        f"TABLE {name} SET IDENTIFIER FIELDS ...)"
    )


SCHEMA_CHANGE_RETRY = Retry(attempts=12, backoff_s=0.03, linear=True, jitter=2 / 3)
"""A schema change that conflicted (workers evolving one table at once) is tried again on the
reloaded table, 12 times in all, after uniformly 0.01-0.05 s times the number of tries so far:
the racing workers drift apart."""


class TableManager:
    """Loads, creates and evolves the sink's tables; caches loaded tables for the process."""

    def __init__(
        self,
        catalog: Catalog,
        config: SinkConfig,
        retry: Retry = SCHEMA_CHANGE_RETRY,
        max_age_seconds: float = 300.0,
    ) -> None:
        self.catalog = catalog
        self.config = config
        self.retry = retry
        """How a schema change that conflicted with another worker's is tried again."""
        self.max_age_seconds = max_age_seconds
        """A cached table is checked again after this long, to see other workers' schema changes
        (and tables dropped or recreated): see :meth:`cached`."""
        self._cache: dict[str, tuple[Table, float]] = {}
        self._arrow_schemas: dict[tuple[uuid.UUID, int], pa.Schema] = {}
        self._lock = threading.Lock()
        self._checking = threading.Lock()
        """Held while expired entries are checked: threads that find them expired meanwhile wait
        for that check instead of asking the catalog again."""
        self._namespaces: set[tuple[str, ...]] = set()
        """Namespaces this manager created or found: a create in one of them asks no more."""
        self._locations: dict[tuple[str, ...], str] = {}
        """Where a SQL catalog puts each namespace's new tables, read at its first create here (a
        namespace's ``location`` changed while the sink runs applies from the next start on)."""

    def settings_for(self, name: str) -> TableSettings:
        if name in self.config.tables:
            return self.config.tables[name]
        if self.config.dynamic is not None:
            return self.config.dynamic.table_settings()
        raise TableError(f"table {name} is not configured")

    def cached(self, name: str) -> Table | None:
        """The cached table, or None: not cached, or expired and not found unchanged.

        An expired entry has every expired entry checked at once (:meth:`_check_expired`): a worker
        loads its tables together (its first batch), so they expire together, and loading each
        again cost ~1-3 ms a table, ~5 % of a worker's core at 5,000 tables. Other catalogs' expired
        tables are loaded again one by one (:meth:`ensure`)."""
        entry = self._fresh(name)
        if entry is None and name in self._cache and sql_catalog.is_sql_catalog(self.catalog):
            with self._checking:
                if self._fresh(name) is None:
                    self._check_expired()
            entry = self._fresh(name)
        return entry

    def _fresh(self, name: str) -> Table | None:
        with self._lock:
            entry = self._cache.get(name)
        if entry is None or time.monotonic() - entry[1] > self.max_age_seconds:
            return None
        return entry[0]

    def _check_expired(self) -> None:
        """Expired entries of a SQL catalog's tables checked in one query per 500 tables
        (:func:`~fanout_sink.pyiceberg_internals.sql_catalog.tables_for_writing`): unmoved or moved
        with nothing a writer uses changed, kept; changed, replaced; dropped, forgotten. A failed
        check leaves them expired: :meth:`ensure` loads each."""
        now = time.monotonic()
        with self._lock:
            expired = {n: t for n, (t, at) in self._cache.items() if now - at > self.max_age_seconds}
        try:
            current = sql_catalog.tables_for_writing(expired)
        except Exception:
            log.debug("could not check %d expired tables at once; loading each", len(expired), exc_info=True)
            return
        with self._lock:
            for name, table in current.items():
                entry = self._cache.get(name)
                if entry is None or entry[0] is not expired[name]:
                    continue  # replaced meanwhile (a schema change of this worker): keep the newer
                if table is None:
                    del self._cache[name]
                else:
                    self._cache[name] = (table, now)

    def identifier_fields(self, name: str) -> tuple[str, ...] | None:
        """An existing table's identifier fields, in schema order (None: no such table, or it has
        none). Loading it here caches it for the ``ensure`` that follows, so it costs no extra load."""
        table = self.cached(name)
        if table is None:
            try:
                table = self._remember(name, self.catalog.load_table(name))
            except NoSuchTableError:
                return None
        schema = table.schema()
        return tuple(schema.find_column_name(i) or "" for i in schema.identifier_field_ids) or None

    def arrow_schema(self, table: Table) -> pa.Schema:
        """The table's current schema in Arrow, converted once per table and schema id: each table's
        rows are checked and converted against it on every chunk, and PyIceberg converts anew on
        each call (with 500 tables, ~100 rows each per 50,000-record chunk, a quarter of routing)."""
        metadata = table.metadata
        key = (metadata.table_uuid, metadata.current_schema_id)
        found = self._arrow_schemas.get(key)
        if found is None:
            found = self._arrow_schemas[key] = metadata.schema().as_arrow()
        return found

    def replace(self, name: str, table: Table | None) -> None:
        """Cache ``table`` for ``name`` now, or forget ``name`` (``None``): it was dropped or recreated.

        The cache would otherwise hand out the old table until it expires, and rows written for the
        old table uuid are not the new table's.
        """
        with self._lock:
            if table is None:
                self._cache.pop(name, None)
            else:
                self._cache[name] = (table, time.monotonic())

    def _remember(self, name: str, table: Table) -> Table:
        with self._lock:
            self._cache[name] = (table, time.monotonic())
        return table

    def ensure(
        self,
        name: str,
        settings: TableSettings,
        sample: pa.Table | None = None,
        carried: Carried | None = None,
        key: TableKey | None = None,
    ) -> Table:
        """The table, loaded or (when allowed) created; raises :class:`TableError` otherwise.

        Without a ``schema`` file the table's schema is inferred from ``sample``, the first rows
        routed to it; ``carried`` tells which fields its records hold (:mod:`.inference`). A change
        table's ``key`` becomes a new table's identifier fields and must be an existing table's.
        """
        table = self.cached(name) or self._load_or_create(name, settings, sample, carried, key)
        check_key(name, table, key)
        return table

    def _load_or_create(
        self,
        name: str,
        settings: TableSettings,
        sample: pa.Table | None,
        carried: Carried | None,
        key: TableKey | None,
    ) -> Table:
        try:
            return self._remember(name, self.catalog.load_table(name))
        except NoSuchTableError:
            if not settings.auto_create:
                raise TableError(
                    f"table {name} does not exist and auto-create is off; create it, or set auto-create: true"
                ) from None
        schema = self._declared_schema(name, settings)
        if schema is None:
            if sample is None:
                raise TableError(f"table {name} has no schema file and no rows to infer a schema from")
            schema = Inference.for_table(settings, carried).schema(sample)
        created = iceberg_schema(name, schema, key)
        try:
            table = self.create(name, settings, created)
        except TableAlreadyExistsError:
            table = self.catalog.load_table(name)
        except Exception:
            # A concurrent create can also surface as the catalog's own conflict error.
            if not self.catalog.table_exists(name):
                raise
            table = self.catalog.load_table(name)
        return self._remember(name, table)

    def _declared_schema(self, name: str, settings: TableSettings) -> pa.Schema | None:
        if not settings.schema_file:
            return None
        path = self.config.resolve(settings.schema_file)
        try:
            return avro_to_arrow_schema(load_avro_schema(path))
        except FanoutSinkError as exc:
            raise TableError(f"table {name}: schema file {path}: {exc}") from None

    def create(self, name: str, settings: TableSettings, schema: Schema | pa.Schema) -> Table:
        """Create the table (its namespace first, once per manager) in the catalog with ``settings``'
        spec and properties."""
        namespace = tuple(name.split(".")[:-1])
        if namespace not in self._namespaces:
            try:
                self.catalog.create_namespace_if_not_exists(namespace)
            except NamespaceAlreadyExistsError:
                pass
            except Exception:
                # Another worker created it between the check and the insert (SQL catalogs report
                # that as an integrity error): fine when it exists now.
                if not self.catalog.namespace_exists(namespace):
                    raise
            self._namespaces.add(namespace)
        properties = dict(settings.properties)
        if settings.partition_by:
            txn = self.catalog.create_table_transaction(name, schema=schema, properties=properties)
            with txn.update_spec() as spec:
                stage_partition_spec(spec, settings)
            txn.commit_transaction()
            log.info("created table %s", name)
            return self.catalog.load_table(name)
        # One create request: a create transaction costs a second round trip and commits an
        # AddSchema update besides (sent without last-column-id, which Iceberg's REST catalog
        # accepts: tests/spark/test_spark_object_store.py). Its answer is the table as loaded: a
        # second load cost ~9 ms per table of a whole database's first batch (issue 32).
        if sql_catalog.is_sql_catalog(self.catalog):
            base = self._locations.get(namespace)
            if base is None:
                base = self._locations[namespace] = sql_catalog.namespace_location(self.catalog, namespace)
            location = f"{base}/{name.rsplit('.', 1)[1]}"
            table = sql_catalog.create_table(self.catalog, name, schema, properties, location)
        else:
            table = self.catalog.create_table(name, schema=schema, properties=properties)
        log.info("created table %s", name)
        return table

    def change_schema(self, name: str, table: Table, changes: SchemaChanges) -> Table:
        """Commit ``changes`` to ``table``'s schema; the table as the catalog holds it after."""
        with table.update_schema() as update:
            stage_schema_changes(update, changes)
        log.info("evolved table %s: %s", name, changes.describe())
        return self.catalog.load_table(name)

    def evolve(self, name: str, table: Table, rows: pa.Table, settings: TableSettings) -> Table:
        """The table after the schema changes ``rows`` need and ``settings.evolution`` allows."""
        retryable: tuple[type[BaseException], ...] = (CommitFailedException, ValueError)
        try:  # an embedded SQLite catalog reports a concurrent writer as "database is locked"
            from sqlalchemy.exc import OperationalError

            retryable = (*retryable, OperationalError)
        except ImportError:  # pragma: no cover - other catalogs
            pass
        matching = Matching.of(settings.conversion)
        inference = Inference(skip_null_columns=True, timestamps=settings.conversion.infer_timestamps)
        evolution = settings.evolution
        if not (evolution.add_columns or evolution.widen_types or evolution.make_optional):
            return table
        tries = self.retry.start()
        while True:
            changes = _diff(self.arrow_schema(table), rows, settings, matching, inference)
            if not changes:
                return table
            try:
                return self._remember(name, self.change_schema(name, table, changes))
            except retryable as exc:
                if not tries.again():
                    raise TableError(f"table {name}: schema change kept conflicting: {exc}") from exc
                table = self._remember(name, self.catalog.load_table(name))
