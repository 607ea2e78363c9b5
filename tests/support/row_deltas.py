"""A change round committed as the coordinator commits it, for tests and the benchmark that drive
``row_delta`` without a broker: resolve on the loaded table, then new rows and position deletes
staged as one ``RowDelta`` snapshot of one transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.table import Table, Transaction

from fanout_sink.protocol import row_delta
from fanout_sink.pyiceberg_internals import snapshots


def staged(
    table: Table,
    changes: Sequence[row_delta.ChangeSet],
    resolution: row_delta.Resolution,
    properties: Mapping[str, str] | None = None,
) -> Transaction:
    """A transaction (not committed) holding the changes' data files and the resolution's deletes.

    PyIceberg's default commit retry stays on: ``RowDelta`` must refuse it by itself."""
    txn = table.transaction()
    with snapshots.RowDelta(txn, table.io, dict(properties or {})) as delta:
        for change in changes:
            for data_file in change.data_files:
                delta.append_data_file(data_file)
        for delete_file in resolution.delete_files:
            delta.add_delete_file(delete_file)
    return txn


def commit_round(
    table: Table,
    key: Sequence[str],
    changes: Sequence[row_delta.ChangeSet],
    properties: Mapping[str, str] | None = None,
) -> row_delta.Resolution:
    """Resolve ``changes`` against ``table`` and commit them in one snapshot."""
    resolution = row_delta.resolve(table, key, changes)
    staged(table, changes, resolution, properties).commit_transaction()
    return resolution
