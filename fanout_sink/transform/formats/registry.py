"""The Schema Registry path: ``confluent-avro``, ``confluent-protobuf`` and ``confluent-json-schema``.

The three formats share the Confluent wire format (magic byte 0, the 4-byte big-endian schema id,
then the body; Protobuf puts its message index path first in the body) and one algorithm, kept
here once: check the header of the whole batch in numpy (no per-value Python for it), look each
schema id up once with confluent-kafka's ``SchemaRegistryClient`` (:class:`_WriterSchemas`:
type checked, references resolved, the reason of an unusable id remembered), read the bodies
with the format's :class:`RecordReader`, and make one Arrow table per writer schema
(:func:`~fanout_sink.transform.formats.decoded.in_input_order` joins them).

What differs per format is the reader: :class:`~fanout_sink.transform.formats.avro.AvroReader`,
:class:`~fanout_sink.transform.formats.protobuf.ProtobufReader`,
:class:`~fanout_sink.transform.formats.json_schema.JsonSchemaReader`. Each resolves its writer
schema's references with confluent-kafka's own deserializer for that format, never by hand.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

with warnings.catch_warnings(record=True):  # authlib (the registry client's) warns about httpx on stderr
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.common._httpx_compat import httpx as http
    from confluent_kafka.schema_registry.error import SchemaRegistryError

from fanout_sink.errors import SchemaError, UnknownSchemaIdError
from fanout_sink.retries import Retry
from fanout_sink.transform.formats.decoded import (
    Decoded,
    FieldPaths,
    Undecodable,
    arrow_from_python,
    in_input_order,
    no_records,
    value_bytes,
)

NOT_WIRE_FORMAT = "not Confluent wire format (magic byte 0, 4-byte schema id); is source.format right?"
"""The reason a value without the wire-format header is dead-lettered."""

WRITER_SCHEMA_ONLY: dict[str, Any] = {"subject.name.strategy": lambda ctx, record_name: None}
"""Deserializer config: read with the writer schema only (no subject lookup, no latest version)."""

_HEADER = 5
"""Magic byte and schema id."""
_GUID_MAGIC = 1
_GUID_HEADER = 17
"""Newer serializers may write magic byte 1 and a 16-byte schema GUID instead of the id."""


class RecordReader(Protocol):
    """Reads the values of one registry format, one writer schema at a time."""

    schema_type: ClassVar[str]
    """The registry's name of the format's schemas (``AVRO``, ``PROTOBUF``, ``JSON``)."""
    schema_format: ClassVar[str | None]
    """The form the registry is asked to send a schema in (Protobuf: ``serialized``, the
    descriptor the reader builds from); None: as registered."""
    python_view: ClassVar[bool]
    """Whether the records are what routing reads; if not (timestamps as epoch microseconds and
    maps as pairs, what Arrow takes fastest) routing's view is made from the table."""

    def prepare(self, schema_id: int, schema: Any) -> None:
        """Make a writer schema usable once (references fetched); raises when it cannot be."""
        ...

    def framed(self, value: bytes) -> Any:
        """The value with the rest of its wire header read (Protobuf: the message index path),
        before its schema id is looked up; raises :class:`Undecodable` when that header is bad."""
        ...

    def read(self, schema_id: int, framed: Any) -> tuple[Hashable, dict[str, Any]]:
        """(key of the value's writer schema, its record) from :meth:`framed`'s result; raises
        :class:`Undecodable`."""
        ...

    def arrow_schema(self, key: Hashable) -> pa.Schema | None:
        """The columns a key's records have, or None when their values type the columns."""
        ...


ReaderFactory = Callable[[SchemaRegistryClient], RecordReader]


UNKNOWN_ID_WAIT_S = 5.0
"""How long one decode (a chunk of a slice) waits in all for ids the registry answers 404: a
follower replicating a new schema serves it within seconds. Shared by every id of the chunk, so
many unknown ids wait no longer than one; an id still unknown fails the slice (retried)."""
UNKNOWN_ID_WAIT = Retry(
    deadline_s=UNKNOWN_ID_WAIT_S,
    backoff_s=0.1,
    multiplier=2,
    max_backoff_s=1.0,
    pause_within_deadline=True,
    clock=time.time,
)
"""An unknown id is asked again after 0.1 s, then twice as long each time up to 1 s, no pause
ending past the decode's :data:`UNKNOWN_ID_WAIT_S` budget. Wall-clock, as the ids' first-seen times."""
UNKNOWN_ID_TTL_S = 60.0
"""How long a final 404 (an id unknown for ``source.unknown-schema-id-timeout``) is remembered:
values naming the id are dead-lettered without asking again; after that the next value asks
again, so a schema registered later is read."""


@dataclass(frozen=True)
class _Known:
    problem: str | None
    expires: float | None  # time.time(); None: for good (a usable or an unusable schema)


class _WriterSchemas:
    """Writer schemas by id, checked for their type and made usable once (the reader's
    :meth:`~RecordReader.prepare` fetches the references).

    Registry outages raise :class:`SchemaError` (the sink stops and retries rather than
    dead-lettering good records): the client raises ``SchemaRegistryError`` for an HTTP error answer
    and its HTTP library's ``HTTPError`` (httpx or httpx2, whichever confluent-kafka picked) when
    there is no answer. An unusable schema is the reason every value naming it is dead-lettered,
    remembered per id. An unknown id (404, or a reference the registry lacks) is asked again within
    one :data:`UNKNOWN_ID_WAIT_S` budget per decode; still unknown, it is *pending* (the decode
    fails, the batch is retried) until ``timeout_s`` has passed since it was first seen, and only
    then are its values dead-lettered, that answer remembered for :data:`UNKNOWN_ID_TTL_S`: a
    lagging follower or a restore must not dead-letter good records.

    Times are wall-clock (``time.time``): the driver carries first-seen times from one attempt's
    tasks to the next attempt's, which may run in other processes (:meth:`seen_since`).
    """

    def __init__(self, client: SchemaRegistryClient, reader: RecordReader, timeout_s: float) -> None:
        self._client = client
        self._reader = reader
        self._timeout_s = timeout_s
        self._ready: dict[int, _Known] = {}
        self._first_unknown: dict[int, float] = {}
        self._lock = threading.Lock()

    def seen_since(self, since: dict[int, float]) -> None:
        """Ids other processes found unknown, with when they first did: the earliest time counts."""
        with self._lock:
            for schema_id, seen in since.items():
                self._first_unknown[schema_id] = min(seen, self._first_unknown.get(schema_id, seen))

    def problems(self, schema_ids: list[int]) -> tuple[dict[int, str | None], dict[int, float]]:
        """Why values with each id cannot be read (None: they can), and the pending ids (unknown for
        less than the timeout) with when each was first seen."""
        deadline = UNKNOWN_ID_WAIT.deadline()
        problems: dict[int, str | None] = {}
        pending: dict[int, float] = {}
        for schema_id in schema_ids:
            with self._lock:
                known = self._ready.get(schema_id)
            if known is not None and (known.expires is None or known.expires > time.time()):
                problems[schema_id] = known.problem
                continue
            with self._lock:
                first = self._first_unknown.get(schema_id)
            overdue = first is not None and time.time() - first >= self._timeout_s
            problem, missing = self._look_up(schema_id, time.time() if overdue else deadline)
            if not missing:
                with self._lock:
                    self._ready[schema_id] = _Known(problem, None)
                    self._first_unknown.pop(schema_id, None)
                problems[schema_id] = problem
                continue
            with self._lock:
                first = self._first_unknown.setdefault(schema_id, time.time())
            unknown_for = time.time() - first
            if unknown_for < self._timeout_s:
                pending[schema_id] = first
                continue
            problem = (
                f"{problem} for {unknown_for:.0f}s, longer than source.unknown-schema-id-timeout "
                f"({self._timeout_s:g}s); check source.schema-registry.url points at the producers' "
                "registry, or register the schema and replay this dead letter"
            )
            with self._lock:
                self._ready[schema_id] = _Known(problem, time.time() + UNKNOWN_ID_TTL_S)
            problems[schema_id] = problem
        return problems, pending

    def served(self, schema_ids: list[int]) -> list[int]:
        """Those of ``schema_ids`` the registry has served this process (a schema, usable or not)."""
        with self._lock:
            return [
                i for i in schema_ids if (known := self._ready.get(i)) is not None and known.expires is None
            ]

    def _look_up(self, schema_id: int, deadline: float | None) -> tuple[str | None, bool]:
        """The problem of ``schema_id`` (None: usable), and whether the registry lacked it (asked
        again until ``deadline``, by :data:`UNKNOWN_ID_WAIT`)."""
        tries = UNKNOWN_ID_WAIT.start(deadline)
        while True:
            try:
                schema = self._client.get_schema(schema_id, fmt=self._reader.schema_format)
            except (SchemaRegistryError, http.HTTPError) as exc:
                _missing(exc, f"schema id {schema_id}")
                if not tries.again():
                    return f"unknown schema id {schema_id} in the Schema Registry", True
                continue
            return self._usable(schema_id, schema)

    def _usable(self, schema_id: int, schema: Any) -> tuple[str | None, bool]:
        kind = str(schema.schema_type or "AVRO")
        expected = self._reader.schema_type
        if kind != expected:
            return f"schema id {schema_id} is {kind}, not {expected}; is source.format right?", False
        try:
            self._reader.prepare(schema_id, schema)
        except (SchemaRegistryError, http.HTTPError) as exc:
            _missing(exc, f"the references of schema id {schema_id}")
            return f"schema id {schema_id} references a schema the registry does not have: {exc}", True
        except Exception as exc:  # a registered schema the libraries cannot build: many types
            return f"schema id {schema_id} cannot be used: {type(exc).__name__}: {exc}", False
        return None, False


def _missing(exc: Exception, what: str) -> None:
    """Returns when the registry answered 404 (the schema is not there); raises
    :class:`SchemaError` when it could not answer (down, refused the credentials)."""
    if isinstance(exc, SchemaRegistryError) and exc.http_status_code == 404:
        return
    raise SchemaError(
        f"Schema Registry lookup of {what} failed: {type(exc).__name__}: {exc}\n"
        "  fix: check source.schema-registry.url and its credentials, and that the registry is up; "
        "nothing of the batch was committed, so a restarted sink reads it again"
    ) from exc


def schema_ids(values: pa.Array) -> tuple[list[int], list[tuple[int, str]]]:
    """The schema id in each value's wire-format header (-1: none) and the failures of the values
    without one, read from the array's one data buffer for the whole batch."""
    data, bounds = value_bytes(values)
    starts, lengths = bounds[:-1], np.diff(bounds)
    null = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    ids = np.full(len(values), -1, dtype=np.int64)
    long_enough = np.flatnonzero(~null & (lengths >= _HEADER))
    wire = long_enough[data[starts[long_enough]] == 0]
    at = starts[wire]
    ids[wire] = sum(data[at + 1 + i].astype(np.int64) << (8 * (3 - i)) for i in range(4))
    failures = [(int(index), "value is null") for index in np.flatnonzero(null)]
    guid = ~null & (lengths >= _GUID_HEADER)
    guid[guid] = data[starts[guid]] == _GUID_MAGIC
    for index in np.flatnonzero(~null & (ids < 0)).tolist():
        hint = " (a schema GUID header is not supported)" if guid[index] else ""
        failures.append((index, NOT_WIRE_FORMAT + hint))
    return ids.tolist(), failures


class RegistryDecoder:
    """Schema Registry values of one format, one Arrow table per writer schema.

    A reader's Arrow schema (Avro and Protobuf: from the writer schema; JSON Schema: when the schema
    fixes the columns) types them; without one they are built from the records as for
    ``format: json``, JSON text where a field's values do not share a type.
    """

    def __init__(
        self, reader: ReaderFactory, registry_conf: dict[str, str], unknown_id_timeout_s: float
    ) -> None:
        """``unknown_id_timeout_s``: ``source.unknown-schema-id-timeout``, how long an id the
        registry does not know fails the slice (retried) before its values are dead-lettered."""
        client = SchemaRegistryClient(dict(registry_conf))
        self.reader = reader(client)
        self._schemas = _WriterSchemas(client, self.reader, unknown_id_timeout_s)
        self._timeout_s = unknown_id_timeout_s

    def seen_since(self, since: dict[int, float]) -> None:
        """Schema ids earlier attempts (in any process) found unknown, with when they first did."""
        self._schemas.seen_since(since)

    def served(self, schema_ids: list[int]) -> list[int]:
        """Those of ``schema_ids`` (ids found unknown before) the registry has served this process
        since: a task reports them, and they leave the driver's
        :class:`~fanout_sink.transform.formats.unknown_ids.UnknownSchemaIds`."""
        return self._schemas.served(schema_ids)

    def __call__(self, values: pa.Array, fields: FieldPaths | None = None) -> Decoded:
        """``fields`` is not needed: every value is decoded with its writer schema. Raises
        :class:`~fanout_sink.errors.UnknownSchemaIdError` (its first value's index in ``values`` as
        :attr:`first`) while an id is unknown for less than the timeout."""
        if len(values) == 0:
            return no_records()
        ids, failures = schema_ids(values)
        framed: list[tuple[int, int, Any]] = []  # (index, schema id, the value framed)
        for index, (schema_id, value) in enumerate(zip(ids, values.to_pylist(), strict=True)):
            if schema_id < 0:
                continue
            try:
                framed.append((index, schema_id, self.reader.framed(value)))
            except Undecodable as exc:
                failures.append((index, str(exc)))
        # Every id of the chunk at once: their waits share one budget, their timeouts run together.
        problems, pending = self._schemas.problems(list(dict.fromkeys(i for _, i, _ in framed)))
        if pending:
            raise UnknownSchemaIdError(
                pending, self._timeout_s, first=next(index for index, i, _ in framed if i in pending)
            )
        groups: dict[Hashable, tuple[list[int], list[dict[str, Any]]]] = {}
        for index, schema_id, value in framed:
            try:
                problem = problems[schema_id]
                if problem is not None:
                    raise Undecodable(problem)
                key, record = self.reader.read(schema_id, value)
            except Undecodable as exc:
                failures.append((index, str(exc)))
                continue
            indices, records = groups.setdefault(key, ([], []))
            indices.append(index)
            records.append(record)
        return self._tables(groups, failures)

    def _tables(
        self, groups: dict[Hashable, tuple[list[int], list[dict[str, Any]]]], failures: list[tuple[int, str]]
    ) -> Decoded:
        parts: list[pa.Table] = []
        rows: list[int] = []
        objects: list[dict[str, Any]] | None = []
        lossy: frozenset[str] = frozenset()
        for key, (indices, records) in groups.items():
            schema = self.reader.arrow_schema(key)
            table = None
            if schema is not None:
                try:
                    table = pa.Table.from_pylist(records, schema=schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    pass  # a JSON integer beyond int64: the values type the columns
                else:
                    if not self.reader.python_view:
                        objects = None
            if table is None:
                table, more = arrow_from_python(records)
                lossy |= more
            parts.append(table)
            rows.extend(indices)
            if objects is not None:
                objects.extend(records)
        return in_input_order(parts, rows, objects, failures, lossy)
