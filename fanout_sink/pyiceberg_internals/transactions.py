"""The transaction the sink commits a table with: attempted once, its staged metadata applied once
per change of it, and on a SQL catalog committed against the table as the caller loaded it.

What it reaches into: ``pyiceberg.table.Transaction``, subclassed by ``_StagedTransaction``,
overriding ``table_metadata`` and reading ``_table`` and ``_updates``.
"""

from __future__ import annotations

from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate

from fanout_sink.pyiceberg_internals.metadata_updates import apply_updates
from fanout_sink.pyiceberg_internals.sql_catalog import (
    PointerSwap,
    commit_catalog,
    staged_swap,
    staging_catalog,
)


class _StagedTransaction(Transaction):
    """A transaction that applies its staged updates to the table metadata once per change of them.

    PyIceberg's ``Transaction.table_metadata`` re-applies every staged update, deep-copying the
    whole metadata, on each access; one append reads it ~19 times, which was ~40 % of a table
    commit's CPU and grows with the table's snapshots (docs/benchmarks/wide-sinks.md). The result
    is a pure function of the base metadata and the staged updates (both immutable and replaced,
    never changed in place), so it is kept until either is replaced.
    """

    _applied: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        applied = self._applied
        if applied is None or applied[0] is not base or applied[1] is not updates:
            applied = (base, updates, apply_updates(base, updates))
            self._applied = applied
        return applied[2]


def no_retry_transaction(table: Table, staged: bool = False) -> Transaction:
    """A transaction whose commit is attempted exactly once.

    PyIceberg 0.12 retries a failed commit by rebasing the same append onto the new head, reading
    the retry count from the table properties at commit time. Rebasing without re-checking the
    stored control offsets could append files another coordinator already appended, so the
    transaction runs on a view of the table whose properties say ``commit.retry.num-retries=0``.
    Only updates and requirements are sent to the catalog: the table's real properties are untouched.
    A SQL catalog commits against ``table`` as loaded instead of loading it again
    (:func:`.sql_catalog.commit_catalog`); other catalogs (a REST catalog's commit loads nothing in the
    client) commit as they do.

    ``staged`` (SQL catalogs, :func:`.sql_catalog.supports_pointer_swaps`): the commit writes every file
    and the new metadata file but leaves the catalog's pointer where it is; :func:`pointer_swap` then
    says what to swap (:func:`.sql_catalog.swap_pointers`).
    """
    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    catalog = table.catalog
    pinned = Table(
        table.name(),
        metadata=table.metadata.model_copy(update={"properties": properties}),
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=staging_catalog(catalog, table) if staged else commit_catalog(catalog, table),
    )
    return _StagedTransaction(pinned)


def pointer_swap(txn: Transaction) -> PointerSwap:
    """What committing a ``staged`` :func:`no_retry_transaction` left to swap."""
    return staged_swap(txn._table.catalog)
