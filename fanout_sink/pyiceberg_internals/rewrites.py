"""A compaction's snapshot committed by PyIceberg: Iceberg's ``replace`` operation (files removed and
files holding the same rows added), as Iceberg Java's ``RewriteFiles`` commits it.

What it reaches into: ``pyiceberg.table.update.snapshot._OverwriteFiles``, subclassed by
:class:`_ReplaceFiles`, overriding ``_summary`` and ``_refresh_for_retry``, and reading
``_parent_snapshot_id`` and ``_transaction._table``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles

from fanout_sink.pyiceberg_internals.transactions import no_retry_transaction


class _ReplaceFiles(_OverwriteFiles):
    """PyIceberg's overwrite producer with the ``replace`` operation: readers of the table's changes
    (incremental scans, streaming reads) skip it, as they skip Spark's ``rewrite_data_files``.
    PyIceberg's summary code knows only append, overwrite and delete, so the summary is built as an
    overwrite's (the same totals) and then named ``replace``.

    Its commit asserts that the branch still points at the snapshot the files were planned from:
    PyIceberg's rebasing retry is refused, and the caller plans again on the reloaded table, so a
    delete file the sink committed meanwhile can never be lost under a rewritten file."""

    def _summary(self, snapshot_properties: dict[str, str] | None = None) -> Summary:
        summary = super()._summary(snapshot_properties or {})
        return Summary(Operation.REPLACE, **summary.additional_properties)

    def _refresh_for_retry(self) -> None:
        raise CommitFailedException(
            f"table {'.'.join(self._transaction._table.name())} changed since its files were planned "
            f"at snapshot {self._parent_snapshot_id}; plan the rewrite again on the reloaded table"
        )


def commit_replace(table: Table, removed: Sequence[DataFile], added: Sequence[DataFile]) -> Table:
    """One ``replace`` snapshot on ``table`` as loaded: ``removed`` out, ``added`` in. Raises
    ``CommitFailedException`` when the table changed since it was loaded (nothing committed)."""
    transaction = no_retry_transaction(table)
    producer = _ReplaceFiles(operation=Operation.OVERWRITE, transaction=transaction, io=table.io)
    for data_file in removed:
        producer.delete_data_file(data_file)
    for data_file in added:
        producer.append_data_file(data_file)
    producer.commit()
    return transaction.commit_transaction()
