"""Staged updates applied to table metadata as PyIceberg applies them, without its deep copy.

What it reaches into: ``pyiceberg.table.update``'s ``_apply_table_update``,
``_TableMetadataUpdateContext`` and ``_update_table_metadata_log``.
"""

from __future__ import annotations

from datetime import datetime

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis


def apply_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """``update_table_metadata(base, updates, metadata_location=...)`` without its final deep copy.

    PyIceberg deep-copies the whole resulting metadata (every snapshot, schema and spec) on each
    application, defensively; it was ~a fifth of a table commit's CPU, growing with the table's
    snapshots (docs/benchmarks/wide-sinks.md). Its models are frozen and every update is applied
    copy-on-write (``model_copy(update=...)``, new lists and dicts), so the result shares only what
    nobody changes with ``base``.
    """
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            now_ms = datetime_to_millis(datetime.now().astimezone())
            metadata = metadata.model_copy(update={"last_updated_ms": now_ms})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata
