"""The SQL catalog's fast paths: the metadata pointers of many tables in one query, a table read from
a pointer so found (or kept, when nothing its writers use changed), a commit against the table
as its caller loaded it (no second load), and many tables' commits staged, then their pointers
swapped in one transaction.

The SQL catalog module is imported here only when a process uses one (``sys.modules`` is asked
first): it imports SQLAlchemy (150 modules, 20 MB), which the processes of a REST or Hive sink never
need. What it reaches into:

- ``pyiceberg.catalog.sql.SqlCatalog``: subclassed by ``_LoadedBaseSqlCatalog`` (built on first use),
  overriding ``load_table`` and the private ``_update_and_stage_table`` (reading
  ``_parse_metadata_version`` and ``_load_file_io``), and sharing the catalog's attributes without
  running its ``__init__``.
- ``pyiceberg.catalog.sql``'s ``IcebergTables`` (the catalog's table rows) and ``SqlCatalog``'s private
  ``_iceberg_type_filter``: :func:`current_table_uuids` and :func:`sql_metadata_locations` read many
  tables' metadata pointers in one query.
- ``SqlCatalog.commit_table``: overridden by ``_StagingSqlCatalog`` (a subclass of the above) to stop
  before its ``UPDATE`` (reading ``_write_metadata``; ``_delete_old_metadata`` overridden, and called
  by :func:`swap_pointers` after the rows moved); ``IcebergTables`` again for that ``UPDATE``, many
  tables' in one transaction.
- ``Catalog._load_file_io``: :func:`load_table_at` and :func:`tables_for_writing` build a table as
  ``SqlCatalog.load_table`` does; the latter reads metadata JSON keys itself (:data:`WRITER_FIELDS`)
  and parses it with ``TableMetadataUtil.parse_obj`` only when those differ.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import sys
import uuid
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier

from fanout_sink.pyiceberg_internals.metadata_updates import apply_updates


@functools.cache
def _loaded_base_sql_catalog() -> type[Catalog]:
    """Made on first use, like the Hive one: PyIceberg's SQL catalog imports SQLAlchemy (150 modules,
    20 MB), which the processes of a REST or Hive sink never need."""
    from pyiceberg.catalog.sql import SqlCatalog

    class _LoadedBaseSqlCatalog(SqlCatalog):
        """The SQL catalog committing one table against the metadata its caller loaded it with.

        ``SqlCatalog.commit_table`` loads the table again (a query, the metadata JSON read and parsed)
        to check the requirements against and apply the updates to: a second load per table commit
        after the caller's own, ~a fifth of the commit's CPU. The caller's load is as good: the commit's
        ``UPDATE`` still requires the table's row to point at the metadata location that was loaded,
        so a commit by anyone in between fails it with ``CommitFailedException`` exactly as before,
        and requirements that hold on that metadata hold on the metadata the ``UPDATE`` requires.

        It never runs the catalog's ``__init__``: every attribute (name, properties, engine) is read
        from ``catalog``; only ``base``'s own identifier is answered from ``base``.
        """

        def __init__(self, catalog: SqlCatalog, base: Table) -> None:
            self._catalog = catalog
            self._base = base

        def __getattr__(self, name: str) -> Any:
            return getattr(self._catalog, name)

        def load_table(self, identifier: str | Identifier) -> Table:
            if self.identifier_to_tuple(identifier) != self._base.name():
                return self._catalog.load_table(identifier)
            return self._base

        def _update_and_stage_table(
            self,
            current_table: Table | None,
            table_identifier: Identifier,
            requirements: tuple[TableRequirement, ...],
            updates: tuple[TableUpdate, ...],
        ) -> StagedTable:
            """PyIceberg's staging of an existing table's commit, with :func:`apply_updates`."""
            if current_table is None:
                return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
            for requirement in requirements:
                requirement.validate(current_table.metadata)
            metadata = apply_updates(current_table.metadata, updates, current_table.metadata_location)
            version = self._parse_metadata_version(current_table.metadata_location) + 1
            provider = load_location_provider(metadata.location, metadata.properties)
            location = provider.new_table_metadata_file_location(version)
            return StagedTable(
                identifier=table_identifier,
                metadata=metadata,
                metadata_location=location,
                io=self._load_file_io(properties=metadata.properties, location=location),
                catalog=self,
            )

    return _LoadedBaseSqlCatalog


@functools.cache
def _staging_sql_catalog() -> type[Catalog]:
    """Made on first use, as :func:`_loaded_base_sql_catalog`."""

    class _StagingSqlCatalog(_loaded_base_sql_catalog()):  # type: ignore[misc]
        """The same commit without its last step: the new metadata file is written, the table's row is
        not moved; the move is kept in :attr:`swap` for :func:`swap_pointers`, which moves many tables'
        rows in one transaction. Dropping old metadata files (``write.metadata.delete-after-commit``)
        waits for the swap too."""

        swap: PointerSwap | None = None

        def commit_table(
            self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
        ) -> CommitTableResponse:
            staged = self._update_and_stage_table(self._base, table.name(), requirements, updates)
            self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
            self.swap = PointerSwap(self._base, staged.metadata, staged.metadata_location, staged.io)
            return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)  # type: ignore[call-arg]

        def _delete_old_metadata(self, io: FileIO, base: TableMetadata, metadata: TableMetadata) -> None:
            """Not before the swap (:func:`swap_pointers` does it for the rows it moved)."""

    return _StagingSqlCatalog


@dataclass(frozen=True)
class PointerSwap:
    """A table commit staged on a SQL catalog: its files and new metadata file written, the catalog's
    row still pointing at ``base``'s metadata location."""

    base: Table
    metadata: TableMetadata
    metadata_location: str
    io: FileIO

    @property
    def identifier(self) -> str:
        return ".".join(self.base.name())


def supports_pointer_swaps(catalog: Catalog) -> bool:
    """Whether ``catalog`` can stage table commits and swap their pointers together: a SQL catalog
    whose database reports the rows an ``UPDATE`` changed (PyIceberg's own compare-and-swap needs that
    too; without it PyIceberg locks the row with ``SELECT ... FOR UPDATE`` instead)."""
    sql: Any = catalog
    return is_sql_catalog(catalog) and bool(sql.engine.dialect.supports_sane_rowcount)


def staging_catalog(catalog: Catalog, table: Table) -> Catalog:
    """The catalog a table commit is staged through instead of committed (:class:`PointerSwap`)."""
    return _staging_sql_catalog()(catalog, table)  # type: ignore[call-arg,arg-type]


def staged_swap(catalog: Catalog) -> PointerSwap:
    """What a transaction committed through :func:`staging_catalog` staged."""
    swap = getattr(catalog, "swap", None)
    if not isinstance(swap, PointerSwap):
        raise RuntimeError("the transaction staged no commit (it had no updates)")
    return swap


def swap_pointers(catalog: Catalog, swaps: Iterable[PointerSwap]) -> set[str]:
    """Move each staged table's row to its new metadata file, all in one transaction of ``catalog``'s
    database; the identifiers moved. Each row moves only if it still points at the metadata the
    commit was staged on (PyIceberg's own ``UPDATE ... WHERE metadata_location = :old``): a table
    someone else committed to since is left out, for its caller to reload and commit again. The rows
    are updated in name order, so two such transactions on a server database lock them in one order.

    One transaction instead of one per table: on SQLite each commit is the database's write lock and
    its journal's fsyncs, and four commit threads queued for that lock (60 % of a commit's wall time,
    docs/benchmarks/wide-sinks.md, "Table commits in groups")."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import update

    ordered = sorted(swaps, key=lambda s: _catalog_key(s.base.name()))
    moved: set[str] = set()
    sql: Any = catalog
    with sql.engine.begin() as connection:
        for swap in ordered:
            namespace, name = _catalog_key(swap.base.name())
            result = connection.execute(
                update(IcebergTables)
                .where(
                    IcebergTables.catalog_name == sql.name,
                    IcebergTables.table_namespace == namespace,
                    IcebergTables.table_name == name,
                    IcebergTables.metadata_location == swap.base.metadata_location,
                )
                .values(
                    metadata_location=swap.metadata_location,
                    previous_metadata_location=swap.base.metadata_location,
                )
            )
            if result.rowcount == 1:
                moved.add(swap.identifier)
    for swap in ordered:
        if swap.identifier in moved:
            try:
                Catalog._delete_old_metadata(swap.io, swap.base.metadata, swap.metadata)
            except Exception as exc:  # as PyIceberg's own commit: the commit stands
                warnings.warn(f"Failed to delete old metadata after commit: {exc}", stacklevel=2)
    return moved


NAMES_PER_QUERY = 500
"""Table names in one ``IN`` list of :func:`current_table_uuids`' query (SQLite allows 32,766 variables)."""
HEAD_BYTES = 4096
"""The head of a metadata file searched for its ``table-uuid`` before the whole file is read."""
_TABLE_UUID = re.compile(rb'"table-uuid"\s*:\s*"([0-9a-fA-F-]{36})"')


def current_table_uuids(tables: dict[str, Table]) -> dict[str, str | None]:
    """The uuid each table's SQL catalog holds under its name now (None: no such table), for the
    tables whose catalog is a SQL catalog; the others are left out, for the caller to load.

    A worker checks before every transaction that its cached tables were not dropped and recreated.
    Loading each table for that read and validated its whole metadata JSON, which grows with the
    snapshots kept (0.8 ms a table with 11 snapshots, against 0.04 ms here). Here one query reads the pointers
    of up to :data:`NAMES_PER_QUERY` tables; a pointer that has not moved since the table was loaded
    is the same table; a moved one (every table commit moves it) is asked for ``table-uuid`` only,
    from the head of the new metadata file, where Iceberg's writers put it, else from all of it.
    """
    found: dict[str, str | None] = {}
    for catalog, group in _by_sql_catalog(tables):
        found.update(_sql_table_uuids(catalog, group))
    return found


def is_sql_catalog(catalog: Catalog) -> bool:
    """Whether ``catalog`` is PyIceberg's SQL catalog (whose fast paths this module has)."""
    sql = sys.modules.get("pyiceberg.catalog.sql")  # not imported: no SQL catalog in this process
    return sql is not None and isinstance(catalog, sql.SqlCatalog)


def _by_sql_catalog(tables: dict[str, Table]) -> list[tuple[Any, list[tuple[str, Table]]]]:
    """``tables`` whose catalog is a SQL catalog, grouped by that catalog (the others left out)."""
    by_catalog: dict[int, list[tuple[str, Table]]] = defaultdict(list)
    for identifier, table in tables.items():
        if is_sql_catalog(table.catalog):
            by_catalog[id(table.catalog)].append((identifier, table))
    return [(group[0][1].catalog, group) for group in by_catalog.values()]


def tables_for_writing(tables: dict[str, Table]) -> dict[str, Table | None]:
    """Each table as a writer of its data files should hold it now (None: no such table), for the
    tables whose catalog is a SQL catalog; the others are left out, for the caller to load.

    A worker keeps the tables it writes for in a cache whose entries expire (to see other writers'
    schema changes); loading each expired table again cost ~1-3 ms (the pointer's query, the metadata
    JSON read and validated), ~5 % of a worker's core at 5,000 tables. Here one query reads the
    pointers of up to :data:`NAMES_PER_QUERY` tables; an unmoved pointer is the same metadata, so the
    table is handed back as it is. A moved one (every commit of the coordinator moves it) is read and
    parsed as plain JSON; if it differs from the loaded metadata in nothing a writer uses
    (:func:`_same_for_writing`: a commit that only added a snapshot and the sink's state), the table
    is handed back as it is too, else it is built from that metadata.
    """
    found: dict[str, Table | None] = {}
    for catalog, group in _by_sql_catalog(tables):
        pointers = _sql_pointers(catalog, {_catalog_key(table.name()) for _, table in group})
        for identifier, table in group:
            location = pointers.get(_catalog_key(table.name()))
            if not location:
                found[identifier] = None
            elif location == table.metadata_location:
                found[identifier] = table
            else:
                found[identifier] = _table_for_writing(catalog, identifier, table, location)
    return found


WRITER_FIELDS = (
    "format-version",
    "table-uuid",
    "location",
    "last-column-id",
    "current-schema-id",
    "default-spec-id",
    "last-partition-id",
    "default-sort-order-id",
)
"""The metadata fields a data file's writer reads besides properties (schemas, specs and sort orders
are found by these ids, and Iceberg never changes one under its id)."""
SINK_PROPERTIES = "fanout-sink."
"""The prefix of the properties the sink records its state in at every commit (``table_state``): no
writer reads them."""


def _same_for_writing(metadata: TableMetadata, raw: dict[str, Any]) -> bool:
    """Whether metadata JSON ``raw`` holds what ``metadata`` holds for a writer of data files."""
    held = {
        "format-version": metadata.format_version,
        "table-uuid": str(metadata.table_uuid),
        "location": metadata.location,
        "last-column-id": metadata.last_column_id,
        "current-schema-id": metadata.current_schema_id,
        "default-spec-id": metadata.default_spec_id,
        "last-partition-id": metadata.last_partition_id,
        "default-sort-order-id": metadata.default_sort_order_id,
    }
    if any(raw.get(name) != held[name] for name in WRITER_FIELDS):
        return False
    return _writer_properties(raw.get("properties") or {}) == _writer_properties(metadata.properties)


def _writer_properties(properties: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in properties.items() if not k.startswith(SINK_PROPERTIES)}


def _table_for_writing(catalog: Catalog, identifier: str, table: Table, location: str) -> Table:
    """``table`` if the metadata at ``location`` holds the same for a writer, else the table built
    from it (as :func:`load_table_at` builds it)."""
    io = catalog._load_file_io(location=location)
    with io.new_input(location).open() as stream:
        text = stream.read()
    raw = json.loads(gzip.decompress(text) if _gzipped(location) else text)
    if _same_for_writing(table.metadata, raw):
        return table
    return _table(catalog, identifier, TableMetadataUtil.parse_obj(raw), location)


def _sql_table_uuids(catalog: Any, tables: list[tuple[str, Table]]) -> dict[str, str | None]:
    pointers = _sql_pointers(catalog, {_catalog_key(table.name()) for _, table in tables})
    uuids: dict[str, str | None] = {}
    for identifier, table in tables:
        location = pointers.get(_catalog_key(table.name()))
        if not location:
            uuids[identifier] = None
        elif location == table.metadata_location:
            uuids[identifier] = str(table.metadata.table_uuid)
        else:
            uuids[identifier] = metadata_table_uuid(table.io, location)
    return uuids


def _catalog_key(identifier: str | Identifier) -> tuple[str, str]:
    """(namespace, name) as the SQL catalog's rows hold them."""
    return Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(
        identifier
    )


def _sql_pointers(catalog: Any, names: set[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
    """The metadata location of each (namespace, name) the SQL catalog holds, one query per
    :data:`NAMES_PER_QUERY` table names."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select

    pointers: dict[tuple[str, str], str | None] = {}
    wanted = sorted({name for _, name in names})
    with catalog.engine.connect() as connection:
        for start in range(0, len(wanted), NAMES_PER_QUERY):
            query = select(
                IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location
            ).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_name.in_(wanted[start : start + NAMES_PER_QUERY]),
            )
            if (type_filter := catalog._iceberg_type_filter()) is not None:
                query = query.where(type_filter)
            for namespace, name, location in connection.execute(query):
                pointers[(namespace, name)] = location
    return pointers


def sql_metadata_locations(catalog: Catalog, identifiers: Iterable[str]) -> dict[str, str | None] | None:
    """Per identifier, the metadata location its SQL catalog points at now (None: no such table);
    None when ``catalog`` is not a SQL catalog (the caller loads each table from the catalog).

    A round's table commits load every due table. ``SqlCatalog.load_table`` spends half of a load in
    one ORM query per table (~1 ms of ~1.8 ms); here one query reads the pointers of up to
    :data:`NAMES_PER_QUERY` tables, and :func:`load_table_at` reads each table's metadata from its
    pointer. A pointer that moves meanwhile is no hazard: the commit's ``UPDATE`` requires the row
    to still point where the metadata was read (see :func:`_loaded_base_sql_catalog`).
    """
    if not is_sql_catalog(catalog):
        return None
    keys = {identifier: _catalog_key(identifier) for identifier in identifiers}
    pointers = _sql_pointers(catalog, set(keys.values())) if keys else {}
    return {identifier: pointers.get(key) for identifier, key in keys.items()}


def load_table_at(catalog: Catalog, identifier: str, location: str) -> Table:
    """The table as the metadata file at ``location`` holds it, built as ``SqlCatalog.load_table``
    builds it from its row, for a location :func:`sql_metadata_locations` read."""
    io = catalog._load_file_io(location=location)
    return _table(catalog, identifier, FromInputFile.table_metadata(io.new_input(location)), location)


def _table(catalog: Catalog, identifier: str, metadata: TableMetadata, location: str) -> Table:
    """The table of ``metadata`` read from ``location``, as ``SqlCatalog.load_table`` builds it."""
    return Table(
        identifier=Catalog.identifier_to_tuple(identifier),
        metadata=metadata,
        metadata_location=location,
        io=catalog._load_file_io(metadata.properties, location),
        catalog=catalog,
    )


def namespace_location(catalog: Any, namespace: tuple[str, ...]) -> str:
    """Where the SQL catalog puts the tables of ``namespace`` (PyIceberg's
    ``_get_default_warehouse_location`` without the table's name): its ``location`` property, else
    ``<warehouse>/<namespace>``. Two statements (the namespace's existence, its properties)."""
    name = Catalog.namespace_to_string(namespace)
    location = catalog.load_namespace_properties(name).get("location")
    if location:
        return str(location).rstrip("/")
    warehouse = catalog.properties.get("warehouse")
    if not warehouse:
        raise ValueError("No default path is set, please specify a location when creating a table")
    return f"{str(warehouse).rstrip('/')}/{name}"


def create_table(
    catalog: Any, identifier: str, schema: Schema | pa.Schema, properties: dict[str, str], location: str
) -> Table:
    """``SqlCatalog.create_table`` of an unpartitioned table at ``location`` (the caller's
    :func:`namespace_location` and the table's name) in a namespace the caller knows exists, without
    its further asks: whether the namespace exists and where it puts tables (the caller knows both),
    and the table's load after the insert (the table is the metadata just written, at the location
    the row now points to). A whole database's first batch creates hundreds of tables; those asks
    were 5 of a create's 7 statements. A name taken meanwhile raises ``TableAlreadyExistsError``, as
    there."""
    from pyiceberg.catalog.sql import IcebergTables
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.io import load_file_io
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table import TableProperties
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from sqlalchemy import insert
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import Session

    version = int(properties.get(TableProperties.FORMAT_VERSION, TableProperties.DEFAULT_FORMAT_VERSION))
    schema = catalog._convert_schema_if_needed(schema, version)
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    metadata_location = load_location_provider(location, properties).new_table_metadata_file_location()
    metadata = new_table_metadata(
        location=location,
        schema=schema,
        partition_spec=UNPARTITIONED_PARTITION_SPEC,
        sort_order=UNSORTED_SORT_ORDER,
        properties=properties,
    )
    catalog._write_metadata(metadata, load_file_io(catalog.properties, metadata_location), metadata_location)
    with Session(catalog.engine) as session:
        try:
            session.execute(
                insert(IcebergTables).values(**catalog._create_table_row(namespace, name, metadata_location))
            )
            session.commit()
        except IntegrityError as exc:
            raise TableAlreadyExistsError(f"Table {namespace}.{name} already exists") from exc
    return _table(catalog, identifier, metadata, metadata_location)


def metadata_table_uuid(io: FileIO, location: str) -> str:
    """The ``table-uuid`` of the metadata file at ``location``: from its first :data:`HEAD_BYTES`,
    where Iceberg's writers put it, else from the whole (possibly gzipped) file."""
    with io.new_input(location).open() as stream:
        text = stream.read(HEAD_BYTES)
        if (found := _TABLE_UUID.search(text)) is not None:
            return str(uuid.UUID(found.group(1).decode()))
        text += stream.read()
    if _gzipped(location):
        text = gzip.decompress(text)
    return str(uuid.UUID(json.loads(text)["table-uuid"]))


def _gzipped(location: str) -> bool:
    """Whether the metadata file at ``location`` is gzipped (by its name, as Iceberg names them)."""
    return location.endswith((".gz.metadata.json", ".metadata.json.gz"))


def commit_catalog(catalog: Catalog, table: Table) -> Catalog:
    """The catalog to commit ``table`` through: for a SQL catalog, one that commits against ``table``
    as loaded instead of loading it again (``_LoadedBaseSqlCatalog``); any other catalog as it is."""
    if is_sql_catalog(catalog):
        return _loaded_base_sql_catalog()(catalog, table)  # type: ignore[call-arg,arg-type]
    return catalog
