"""What the Java sink writes that the takeover reads: the events on its control topic (Apache's and
Tabular's alike) and the control offsets its coordinator records in each snapshot's summary.

Each event carries the Avro schema it was written with, so both sink families and later event
versions decode alike; only ``DataWritten`` (the files a worker announces for a table) matters here.
Tabular's own events (``io.tabular.iceberg.connect.events``, up to 0.6.x) spell their fields in
camelCase (``groupId``, ``tableName``, ``dataFiles``) where Apache's, which Tabular took later, use
snake_case; both are read.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException

_EVENT_MAGIC = b"\xc2\x01"
_DATA_WRITTEN = 1
_SUMMARY_PREFIX = "kafka.connect.offsets."
_AVRO_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class UndecodableEvent(ValueError):
    """A control record framed as an Iceberg Kafka Connect event that does not decode as one."""


def avro_short_names(schema: Any) -> Any:
    """The schema with every named type and reference by its short name, namespaces dropped.

    Iceberg Java writes its UUID type as a fixed ``uuid_fixed`` without a namespace inside namespaced
    records, then refers to it by a name fastavro resolves into the enclosing namespace
    (``org.apache.iceberg.connect.events.uuid_fixed``), which it never defined. The events' type
    names are unique without their namespaces (Iceberg names structs ``r<field id>``)."""
    if isinstance(schema, str):
        return schema if schema in _AVRO_PRIMITIVES else schema.rsplit(".", 1)[-1]
    if isinstance(schema, list):
        return [avro_short_names(item) for item in schema]
    if isinstance(schema, dict):
        out = {key: value for key, value in schema.items() if key != "namespace"}
        if schema.get("type") in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
            out["name"] = schema["name"].rsplit(".", 1)[-1]
        for key in ("type", "items", "values"):
            if key in schema:
                out[key] = avro_short_names(schema[key])
        if "fields" in schema:
            out["fields"] = [{**f, "type": avro_short_names(f["type"])} for f in schema["fields"]]
        return out
    return schema


def decode_event(value: bytes) -> dict[str, Any]:
    """One Java sink control event: two magic bytes, the writer's Avro schema (Java's ``writeUTF``:
    a two-byte length), then the datum. Decoded with the schema it carries, so both sink families and
    later event versions read alike; raises :class:`UndecodableEvent` saying what did not decode."""
    if value[:2] != _EVENT_MAGIC:
        raise UndecodableEvent("not an Iceberg Kafka Connect event (no magic bytes)")
    try:
        (length,) = struct.unpack(">H", value[2:4])
        text = json.loads(value[4 : 4 + length].decode("utf-8"))
        schema = fastavro.parse_schema(avro_short_names(text))
        record = fastavro.schemaless_reader(io.BytesIO(value[4 + length :]), schema, None)
    except (ValueError, KeyError, TypeError, EOFError, struct.error, SchemaParseException) as exc:
        raise UndecodableEvent(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    if not isinstance(record, dict):
        raise UndecodableEvent("an Iceberg Kafka Connect event is an Avro record")
    return record


def _field(record: Any, *names: str) -> Any:
    """The first of ``names`` the record holds (Apache's snake_case, Tabular's camelCase)."""
    if not isinstance(record, dict):
        return None
    return next((record[name] for name in names if record.get(name) is not None), None)


def announced_table(value: bytes | None, group: str) -> str | None:
    """The table a control record announces files for, when it is a ``DataWritten`` event of this
    connector (its events carry ``group``: Apache's Connect group, Tabular's control group) naming
    data or delete files; None for any other record: another connector's (they share the default
    control topic), another event type, or not the Java sink's (no magic bytes). Raises
    :class:`UndecodableEvent` for a record framed as an event that does not decode."""
    if not value or value[:2] != _EVENT_MAGIC:
        return None
    event = decode_event(value)
    if _field(event, "group_id", "groupId") != group or event.get("type") != _DATA_WRITTEN:
        return None
    payload = _field(event, "payload") or {}
    if not (_field(payload, "data_files", "dataFiles") or _field(payload, "delete_files", "deleteFiles")):
        return None
    ref = _field(payload, "table_reference", "table_name", "tableName") or {}
    return ".".join([*(_field(ref, "namespace") or []), _field(ref, "name") or ""])


def recorded_control_offset(table: Any, control_topic: str, group: str, partition: int) -> int | None:
    """The control offset this connector's coordinator recorded in the newest snapshot it made.

    The key names the control topic and the group its events carry: Apache's coordinator names
    Connect's group (``connect-<name>``), Tabular's its control group (``iceberg.control.group-id``,
    default ``cg-control-<name>``). Connectors share the default control topic (``control-iceberg``),
    so another connector's commits to the same table must not count."""
    key = f"{_SUMMARY_PREFIX}{control_topic}.{group}"
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if key in summary:
            offsets = json.loads(summary[key])
            return int(offsets[str(partition)]) if str(partition) in offsets else None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return None
