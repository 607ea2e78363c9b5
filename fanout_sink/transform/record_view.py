"""The record view: a slice's decoded records plus their Kafka metadata, which expressions read.

A record's own fields are at top level, plus the Kafka metadata of the record

=================  ==========================================================================
``topic``          source topic (string)
``partition``      source partition (number)
``offset``         source offset (number)
``timestamp``      record timestamp, epoch milliseconds (number)
``timestamp_type`` Kafka timestamp type (0 create time, 1 log-append time)
``key``            record key as UTF-8 text (invalid bytes replaced), or null
``headers``        object of header name -> UTF-8 text value (the last one wins), per record only
=================  ==========================================================================

The metadata names are visible at top level unless the record has a field of the same name (the
record wins); they are always reachable under ``_kafka`` (``_kafka.topic``). The view gives each
name as an Arrow column for the vectorised path of :mod:`fanout_sink.transform.expressions`, and
every record as a Python object for jmespath.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout_sink.transform.formats.decoded import Decoded

META_FIELDS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers")
META_ROOT = "_kafka"


class Fallback(Exception):
    """An expression (or a part of it) cannot be vectorised for this batch."""


@dataclass
class RecordView:
    """Decoded records plus their Kafka metadata, as Arrow columns and (on demand) Python objects.

    A view taken from another (:meth:`subset`) takes its metadata from the other's only when asked
    for it: most tables read none (no ``select`` naming it, no change events), and taking six
    columns and the headers for each of 50 tables of a chunk cost a fifth of routing it."""

    decoded: Decoded
    source_meta: pa.Table
    """The META_FIELDS but headers, of the view this one was taken from (or its own)."""
    source_headers: pa.Array | None = None
    picked: np.ndarray | None = None
    """This view's records' positions in ``source_meta``; ``None``: all of them."""
    headers: list[dict[str, str]] | None = None
    _python: list[dict[str, Any]] | None = None
    _meta: pa.Table | None = None
    _taken_headers: pa.Array | None = None

    @classmethod
    def build(cls, decoded: Decoded, raw: pa.Table) -> RecordView:
        """``raw`` is the slice (``RAW_RECORD_SCHEMA``); ``decoded.rows`` index into it.

        The records are made one chunk here, once: every table's :meth:`subset` takes from them, and
        Arrow's ``take`` on a chunked table pays for the whole table on each call (100 of 50,000 rows
        over 11 chunks: 0.55 ms, one chunk 0.07 ms), which with 500 tables was most of routing."""
        if any(column.num_chunks > 1 for column in decoded.records.columns):
            decoded = replace(decoded, records=decoded.records.combine_chunks())
        take = pa.array(decoded.rows, pa.int64())
        picked = raw.select(["topic", "partition", "offset", "timestamp", "timestampType", "key"]).take(take)
        key = picked.column("key").combine_chunks()
        try:
            key_text = key.cast(pa.string())
        except pa.ArrowInvalid:
            key_text = pa.array(
                [None if k is None else k.decode("utf-8", "replace") for k in key.to_pylist()], pa.string()
            )
        meta = pa.table(
            {
                "topic": picked.column("topic"),
                "partition": picked.column("partition").cast(pa.int64()),
                "offset": picked.column("offset"),
                "timestamp": pc.cast(
                    pc.cast(picked.column("timestamp"), pa.timestamp("ms", tz="UTC"), safe=False), pa.int64()
                ),
                "timestamp_type": picked.column("timestampType").cast(pa.int64()),
                "key": key_text,
            }
        )
        raw_headers = (
            raw.column("headers").take(take).combine_chunks() if "headers" in raw.column_names else None
        )
        return cls(decoded, meta, raw_headers)

    def __len__(self) -> int:
        return len(self.decoded.rows)

    @property
    def meta(self) -> pa.Table:
        """One row per record: the META_FIELDS but headers."""
        if self._meta is None:
            picked = self.picked
            self._meta = self.source_meta if picked is None else self.source_meta.take(pa.array(picked))
        return self._meta

    @property
    def raw_headers(self) -> pa.Array | None:
        """One list of ``{key, value}`` per record, as the raw slice holds them (None: no headers)."""
        if self._taken_headers is None and self.source_headers is not None:
            picked = self.picked
            self._taken_headers = (
                self.source_headers if picked is None else self.source_headers.take(pa.array(picked))
            )
        return self._taken_headers

    def _taken(self, positions: np.ndarray) -> np.ndarray:
        """``positions`` of this view as positions in ``source_meta``."""
        return positions if self.picked is None else self.picked[positions]

    def subset(self, positions: np.ndarray, key: str | None = None) -> RecordView:
        """The records at ``positions`` with every field (:meth:`Decoded.subset`, ``key`` naming
        their table); its ``decoded.rows`` are positions in this view."""
        decoded = self.decoded.subset(positions, key)
        chosen = decoded.rows
        listed = chosen.tolist() if self.headers is not None or self._python is not None else []
        return RecordView(
            decoded,
            self.source_meta,
            self.source_headers,
            self._taken(chosen),
            None if self.headers is None else [self.headers[p] for p in listed],
            None if self._python is None else [self._python[p] for p in listed],
        )

    def with_records(self, positions: np.ndarray, records: pa.Table) -> RecordView:
        """The records at ``positions`` with their fields replaced by ``records`` (one row each) and
        their Kafka metadata kept: a change event's row image, which ``select`` reads as a record.
        Its ``decoded.rows`` are ``positions``."""
        return RecordView(
            Decoded(records, positions),
            self.source_meta,
            self.source_headers,
            self._taken(positions),
            None if self.headers is None else [self.headers[p] for p in positions.tolist()],
        )

    @property
    def records(self) -> pa.Table:
        return self.decoded.records

    def header_objects(self) -> list[dict[str, str]]:
        if self.headers is None:
            result: list[dict[str, str]] = []
            raw = self.raw_headers
            values = raw.to_pylist() if raw is not None else [None] * len(self)
            for entries in values:
                obj: dict[str, str] = {}
                for entry in entries or []:
                    value = entry["value"]
                    obj[entry["key"]] = "" if value is None else value.decode("utf-8", "replace")
                result.append(obj)
            self.headers = result
        return self.headers

    def python(self) -> list[dict[str, Any]]:
        """Per-record objects for jmespath: record fields, unshadowed metadata, ``_kafka``."""
        if self._python is None:
            records = self.decoded.python()
            metas = self.meta.to_pylist()
            headers = self.header_objects()
            view = []
            for record, meta, hdrs in zip(records, metas, headers, strict=True):
                meta["headers"] = hdrs
                obj = dict(meta)
                for key, value in record.items():
                    if value is not None or key not in obj:
                        obj[key] = value
                obj[META_ROOT] = meta
                view.append(obj)
            self._python = view
        return self._python

    def column(self, name: str) -> pa.Array:
        """A top-level name as a column: a record field, else metadata; unknown names are all null."""
        if name == META_ROOT:  # always the metadata, even when a record has a field of that name
            return pa.StructArray.from_arrays(
                [c.combine_chunks() for c in self.meta.columns], names=self.meta.column_names
            )
        if name in self.decoded.lossy:
            raise Fallback(f"column {name} has mixed types in this batch")
        if self.decoded.routed is not None and name not in self.decoded.routed:
            raise Fallback(f"column {name} is not among the routing fields decoded")
        records = self.decoded.records
        if name in records.column_names:
            column = records.column(name).combine_chunks()
            if name in META_FIELDS and column.null_count:
                if name == "headers":
                    raise Fallback("headers are evaluated per record")
                meta = self.meta.column(name).combine_chunks()
                if column.type != meta.type:
                    raise Fallback(f"record field {name} shadows metadata with another type")
                column = pc.coalesce(column, meta)
            return column
        if name == "headers":
            raise Fallback("headers are evaluated per record")
        if name in self.source_meta.column_names:  # without taking the metadata
            return self.meta.column(name).combine_chunks()
        return pa.nulls(len(self))
