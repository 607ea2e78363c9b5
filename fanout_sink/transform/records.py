"""The shapes that cross the seam between the worker (commit protocol) and routing/conversion.

The worker hands a slice of raw Kafka records to a :data:`SliceProcessor` and gets back, per
destination table, Arrow rows already in that table's schema, plus the dead letters to publish and
the count of records deliberately filtered. The worker then writes files and publishes events;
the processor never touches Kafka or writes data files itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.table import Table

from fanout_sink.kafka.range_reader import RAW_RECORD_SCHEMA

# RAW_RECORD_SCHEMA, the shape of a raw slice, is the Kafka range reader's (layer 1); re-exported
# here as the seam's input shape.
__all__ = ["RAW_RECORD_SCHEMA", "DeadLetter", "RoutedSlice", "SliceProcessor", "TableRows"]


@dataclass(frozen=True)
class DeadLetter:
    """One message for the dead-letter topic, complete with its reason and source headers."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


@dataclass
class TableRows:
    """Rows for one table, converted to ``table``'s current schema (a PyIceberg ``Table``).

    For an append table ``rows`` are all the slice's rows for it. For a change table (``changes:``)
    they hold at most one row per key: the key's last change in the slice (highest Kafka offset)
    when that change is an insert, update or snapshot read; keys whose last change is a delete are
    in ``deleted_keys`` instead, so the worker resolves both against the table in one commit.
    """

    table: Table
    rows: pa.Table
    key: tuple[str, ...] = ()
    """A change table's key columns (its identifier fields, top-level names); () for an append table."""
    deleted_keys: pa.Table | None = None
    """A change table's keys (columns ``key``, in the table's Arrow types) whose last change in the slice
    is a delete; never overlapping the keys of ``rows``."""


@dataclass
class RoutedSlice:
    """What a processor made of one slice: rows per table identifier, dead letters, filtered count."""

    tables: dict[str, TableRows] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    filtered: int = 0
    table_changed: Callable[[str, Table | None], None] | None = None
    """Tells the processor that a table it handed out was dropped (``None``) or recreated (the new
    ``Table``) since it loaded it, so that it stops using its cached copy. The worker calls it when
    its check before the Kafka transaction finds another table uuid, then processes the slice again."""


SliceProcessor = Callable[[pa.Table], RoutedSlice]
"""Routes and converts a raw slice (``RAW_RECORD_SCHEMA``, one topic-partition, offsets ascending)."""
