"""Tables as a run would create and evolve them, kept in memory: nothing reaches the catalog.

:class:`PlannedTables` is the :class:`~fanout_sink.transform.tables.TableManager` of
``fanout-sink route``. It loads existing tables from the catalog as the workers do, and where a
worker would create a table or change its schema it stages the same change on an in-memory copy
(PyIceberg's ``StagedTable`` and an uncommitted ``Transaction``), so the schema inference, the
evolution rules and the conversion that follow are the workers' own, and the catalog is never
written. It remembers what it would have done, for the preview to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import StagedTable, Table, Transaction
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from fanout_sink.config.models import SinkConfig
from fanout_sink.config.tables import TableSettings
from fanout_sink.pyiceberg_internals import arrow_writes
from fanout_sink.transform.tables import (
    SchemaChanges,
    TableManager,
    stage_partition_spec,
    stage_schema_changes,
)


@dataclass
class Plan:
    """What a run would do to one table: create it, and the schema changes it would make."""

    created: bool = False
    changes: list[str] = field(default_factory=list)
    """Each schema change as the workers' log line says it (``add note, widen qty to long``)."""
    added: list[str] = field(default_factory=list)
    """Top-level columns a run would add to the table (all of them for a created table)."""


class PlannedTables(TableManager):
    """Existing tables from the catalog; creations and schema changes staged in memory only."""

    def __init__(self, catalog: Catalog, config: SinkConfig) -> None:
        # Never expire a cached table: a planned table exists nowhere else to be loaded again.
        super().__init__(catalog, config, max_age_seconds=float("inf"))
        self.plans: dict[str, Plan] = {}

    def create(self, name: str, settings: TableSettings, schema: Schema | pa.Schema) -> Table:
        iceberg = schema if isinstance(schema, Schema) else arrow_writes.schema_from_arrow(schema)
        location = f"planned://{name}"
        metadata = new_table_metadata(
            iceberg, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, dict(settings.properties)
        )
        table = self._staged(name, metadata)
        if settings.partition_by:
            txn = Transaction(table)
            with txn.update_spec() as spec:
                stage_partition_spec(spec, settings)
            table = self._staged(name, txn.table_metadata)
        self.plans[name] = Plan(created=True, added=[f.name for f in table.schema().fields])
        return table

    def change_schema(self, name: str, table: Table, changes: SchemaChanges) -> Table:
        txn = Transaction(table)
        with txn.update_schema() as update:
            stage_schema_changes(update, changes)
        plan = self.plans.setdefault(name, Plan())
        plan.changes.append(changes.describe())
        had = {f.name for f in table.schema().fields}
        plan.added += [f.name for f in changes.adds if f.name not in had]
        return self._staged(name, txn.table_metadata)

    def _staged(self, name: str, metadata: TableMetadata) -> StagedTable:
        return StagedTable(
            identifier=tuple(name.split(".")),
            metadata=metadata,
            metadata_location=f"{metadata.location}/metadata/planned.metadata.json",
            io=load_file_io({}),
            catalog=self.catalog,
        )
