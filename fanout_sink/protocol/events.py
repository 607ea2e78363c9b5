"""Control-topic events: typed payloads, and their versioned Avro encoding.

Workers and the coordinator talk only through these records, possibly across versions of this
package during a rolling upgrade. fastavro's schemaless encoding writes no schema and no version
into a payload, so a reader with another schema would silently misread the bytes. Every message
therefore starts with magic bytes and a version number (``FSNK`` + big-endian uint16); a reader
rejects a version it does not know with :class:`EventVersionError` instead of guessing.

A new version only adds optional fields, marked ``"since": <version>`` in the ``.avsc`` files. An
event of an older version is read with its own schema (the current one without the newer fields)
as the writer's schema, and Avro schema resolution fills in the defaults, so events already on the
control topic stay readable after an upgrade (the coordinator re-reads them after a restart).

The schemas live as ``.avsc`` files in ``schemas/events/`` (packaged as
``fanout_sink/protocol/event_schemas``) so that other languages can read the control topic too.
"""

from __future__ import annotations

import io
import json
import struct
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal

import fastavro
from pydantic import BaseModel, ConfigDict, Field

from fanout_sink.errors import EventVersionError, FanoutSinkError

MAGIC = b"FSNK"
VERSION = 4
"""2: ``DataComplete.min_timestamp_ms``; ``CommitComplete.partition_times``, ``reports_below``,
``low_watermark`` and ``delivered``; ``CommitToTable.control_offset``. 3: ``DataWritten.key`` and
``deleted_keys`` (change tables). 4: ``DataComplete.topic_id`` and ``CommitComplete.topic_ids`` (a
position belongs to one generation of a topic name); ``CommitComplete.part`` and ``parts`` (a round
too large for one message)."""
READABLE_VERSIONS = (1, 2, 3, 4)
_HEADER = struct.Struct(">4sH")
_NAMESPACE = "fanout_sink.events"
# Named types first: later schemas refer to earlier ones by name.
_SCHEMA_FILES = (
    "TableReference",
    "DataFile",
    "StartCommit",
    "DataWritten",
    "DataComplete",
    "CommitToTable",
    "PartitionTime",
    "CommitComplete",
    "Envelope",
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TableRef(_Model):
    """A table by identifier and uuid (a recreated table has the same identifier, a new uuid)."""

    namespace: tuple[str, ...]
    name: str
    uuid: str

    @property
    def identifier(self) -> str:
        return ".".join((*self.namespace, self.name))


class PartitionValue(_Model):
    """One partition field's value in Iceberg's single-value binary encoding (None for null)."""

    field_id: int
    value: bytes | None = None


class DataFileRecord(_Model):
    """An Iceberg data file as it travels on the control topic (see ``writer`` for the conversion)."""

    file_path: str
    file_format: str
    spec_id: int
    partition: tuple[PartitionValue, ...] = ()
    record_count: int
    file_size_in_bytes: int
    column_sizes: dict[int, int] = Field(default_factory=dict)
    value_counts: dict[int, int] = Field(default_factory=dict)
    null_value_counts: dict[int, int] = Field(default_factory=dict)
    nan_value_counts: dict[int, int] = Field(default_factory=dict)
    lower_bounds: dict[int, bytes] = Field(default_factory=dict)
    upper_bounds: dict[int, bytes] = Field(default_factory=dict)
    split_offsets: tuple[int, ...] | None = None
    sort_order_id: int | None = None


class KeyFile(_Model):
    """A Parquet file of a change table's deleted keys: read by the coordinator, never committed."""

    file_path: str
    record_count: int
    file_size_in_bytes: int


class StartCommit(_Model):
    type: Literal["StartCommit"] = "StartCommit"
    commit_id: str


class DataWritten(_Model):
    type: Literal["DataWritten"] = "DataWritten"
    table: TableRef
    files: tuple[DataFileRecord, ...]
    topic: str
    partition: int
    next_offset: int
    key: tuple[str, ...] = ()
    """Since version 3: a change table's key columns; empty for appends."""
    deleted_keys: tuple[KeyFile, ...] = ()
    """Since version 3: files of the keys whose last change in the slice deletes them."""


class DataComplete(_Model):
    type: Literal["DataComplete"] = "DataComplete"
    topic: str
    partition: int
    next_offset: int
    max_timestamp_ms: int | None = None
    min_timestamp_ms: int | None = None
    """Oldest record timestamp of the slice (version 2 on): shows how far timestamps go back."""
    topic_id: str | None = None
    """Since version 4: the Kafka topic id the slice was read from (None in older events): a topic
    deleted and recreated under the same name has another id, and this position is not its."""


class CommitToTable(_Model):
    type: Literal["CommitToTable"] = "CommitToTable"
    commit_id: str
    table: TableRef
    snapshot_id: int | None = None
    vtts_ms: int | None = None
    control_offset: int | None = None  # since version 2: the table's floor after this commit


class PartitionTime(_Model):
    """A source partition's newest delivered timestamp and the largest step back seen in it."""

    topic: str
    partition: int
    max_timestamp_ms: int
    max_disorder_ms: int = 0


class CommitComplete(_Model):
    type: Literal["CommitComplete"] = "CommitComplete"
    commit_id: str
    vtts_ms: int | None = None
    partition_times: tuple[PartitionTime, ...] = ()
    reports_below: int | None = None
    """``partition_times`` account for every ``DataComplete`` below this control offset."""
    delivered: dict[str, int] = Field(default_factory=dict)
    """``"<topic>:<partition>"`` -> the largest ``DataComplete.next_offset`` below ``reports_below``,
    carried from round to round: the sink's delivered positions survive both the sink group's
    offset expiry and the control topic's retention (``recovery.control_topic_positions``)."""
    low_watermark: int | None = None
    """The coordinator group's offset committed in the same transaction; the group's offset expires
    after a long downtime, this record of it stays as long as the control topic keeps it."""
    topic_ids: dict[str, str] = Field(default_factory=dict)
    """Since version 4: topic -> the topic id ``delivered``'s positions of that topic were read from
    (one id per topic: a recreated topic's new id drops the old topic's positions)."""
    part: int = 0
    parts: int = 1
    """Since version 4: a round whose partitions do not fit one message is ``parts`` events, all
    committed in the round's transaction (:func:`split_round`); each carries the round's scalars
    and a share of the per-partition fields. Readers merge the parts of one ``commit_id``."""


def split_round(complete: CommitComplete, sink: str, budget: int) -> list[CommitComplete]:
    """``complete`` as one event, or as parts of at most ``budget`` encoded bytes each.

    A ``CommitComplete`` grows by about 60 bytes per source partition (its position and time), and
    a message over the control topic's ``max.message.bytes`` fails the round's transaction on every
    retry, after its tables committed. The partitions are halved until each part fits; a part of one
    partition that still does not fit raises (the topic's limit is below any round).
    """

    def size(event: CommitComplete) -> int:
        return len(encode(Event(sink=sink, payload=event)))

    if size(complete) <= budget:
        return [complete]
    times = {(t.topic, t.partition): t for t in complete.partition_times}
    delivered = delivered_positions(complete)
    keys = sorted(times.keys() | delivered.keys())

    def piece(share: list[tuple[str, int]]) -> CommitComplete:
        topics = {topic for topic, _ in share}
        return complete.model_copy(
            update={
                "partition_times": tuple(times[k] for k in share if k in times),
                "delivered": delivered_map({k: delivered[k] for k in share if k in delivered}),
                "topic_ids": {t: i for t, i in complete.topic_ids.items() if t in topics},
            }
        )

    shares: list[list[tuple[str, int]]] = []
    todo = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    while todo:
        share = todo.pop(0)
        if size(piece(share)) <= budget or len(share) <= 1:
            if size(piece(share)) > budget:
                raise FanoutSinkError(
                    f"the CommitComplete of round {complete.commit_id} needs {size(piece(share))} bytes for "
                    f"the one partition {share}, more than a control event may take ({budget}).\n"
                    "  fix: raise the control topic's max.message.bytes"
                )
            shares.append(share)
        else:
            todo[:0] = [share[: len(share) // 2], share[len(share) // 2 :]]
    return [
        piece(share).model_copy(update={"part": i, "parts": len(shares)}) for i, share in enumerate(shares)
    ]


def delivered_map(positions: dict[tuple[str, int], int]) -> dict[str, int]:
    """``CommitComplete.delivered`` from per-partition positions (':' is in no topic name)."""
    return {f"{topic}:{partition}": offset for (topic, partition), offset in sorted(positions.items())}


def delivered_positions(complete: CommitComplete) -> dict[tuple[str, int], int]:
    """The per-partition positions a ``CommitComplete`` recorded."""
    found: dict[tuple[str, int], int] = {}
    for key, offset in complete.delivered.items():
        topic, _, partition = key.rpartition(":")
        found[(topic, int(partition))] = offset
    return found


@dataclass
class DeliveredPositions:
    """Per source partition the largest delivered ``next_offset`` of the topic's newest generation.

    Keeps I1 across a topic deleted and recreated: positions are taken in control-topic order, and
    one reported under a topic id other than the one held so far for that topic name means the
    topic was recreated, so the old generation's positions of every partition are dropped (the new
    topic's offsets start over; its records below them were never delivered). A position without
    an id (events before version 4) joins whatever generation is held.
    """

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    topic_ids: dict[str, str] = field(default_factory=dict)

    def take(self, topic: str, partition: int, offset: int, topic_id: str | None) -> None:
        known = self.topic_ids.get(topic)
        if topic_id is not None and known is not None and topic_id != known:
            self.offsets = {key: value for key, value in self.offsets.items() if key[0] != topic}
        if topic_id is not None:
            self.topic_ids[topic] = topic_id
        key = (topic, partition)
        self.offsets[key] = max(self.offsets.get(key, 0), offset)

    def take_report(self, report: DataComplete) -> None:
        self.take(report.topic, report.partition, report.next_offset, report.topic_id)

    def take_round(self, complete: CommitComplete) -> None:
        """What a round carried forward (``delivered`` with ``topic_ids``)."""
        for (topic, partition), offset in delivered_positions(complete).items():
            self.take(topic, partition, offset, complete.topic_ids.get(topic))

    def recorded_id(self, topic: str) -> str | None:
        """The topic id the held positions of ``topic`` were read from (None: not known)."""
        return self.topic_ids.get(topic)

    def of_topic(self, topic: str) -> dict[tuple[str, int], int]:
        return {key: value for key, value in self.offsets.items() if key[0] == topic}

    def round_fields(self) -> dict[str, Any]:
        """``CommitComplete``'s ``delivered`` and ``topic_ids``."""
        topics = {topic for topic, _ in self.offsets}
        return {
            "delivered": delivered_map(self.offsets),
            "topic_ids": {t: i for t, i in sorted(self.topic_ids.items()) if t in topics},
        }


Payload = StartCommit | DataWritten | DataComplete | CommitToTable | CommitComplete
_PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.__name__: cls for cls in (StartCommit, DataWritten, DataComplete, CommitToTable, CommitComplete)
}


class Event(_Model):
    """The envelope: which sink wrote it, a unique id, when, and the payload."""

    sink: str
    payload: Payload = Field(discriminator="type")
    event_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    event_time_ms: int = Field(default_factory=lambda: int(time.time() * 1000))


@cache
def envelope_schema(version: int = VERSION) -> Any:
    """The parsed Envelope schema of ``version`` (with every named type it refers to): the files'
    fields without those added by a later version (``"since"``)."""
    named: dict[str, Any] = {}
    root = resources.files("fanout_sink.protocol") / "event_schemas"
    parsed: Any = None
    for name in _SCHEMA_FILES:
        raw = json.loads((root / f"{name}.avsc").read_text(encoding="utf-8"))
        raw["fields"] = [f for f in raw["fields"] if f.get("since", 1) <= version]
        parsed = fastavro.parse_schema(raw, named_schemas=named)
    return parsed


def _pairs(mapping: dict[int, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": value} for key, value in sorted(mapping.items())]


def _unpairs(pairs: list[dict[str, Any]]) -> dict[int, Any]:
    return {pair["key"]: pair["value"] for pair in pairs}


_MAP_FIELDS = (
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
)


def _file_to_avro(record: DataFileRecord) -> dict[str, Any]:
    data = record.model_dump()
    for name in _MAP_FIELDS:
        data[name] = _pairs(data[name])
    data["partition"] = [dict(p) for p in data["partition"]]
    data["split_offsets"] = list(record.split_offsets) if record.split_offsets is not None else None
    return data


def _file_from_avro(data: dict[str, Any]) -> DataFileRecord:
    data = dict(data)
    for name in _MAP_FIELDS:
        data[name] = _unpairs(data[name])
    return DataFileRecord.model_validate(data)


def _payload_to_avro(payload: Payload) -> tuple[str, dict[str, Any]]:
    data = payload.model_dump(exclude={"type"})
    if isinstance(payload, DataWritten):
        data["files"] = [_file_to_avro(f) for f in payload.files]
        data["key"] = list(payload.key)
        data["deleted_keys"] = [k.model_dump() for k in payload.deleted_keys]
    if isinstance(payload, CommitComplete):
        data["partition_times"] = [p.model_dump() for p in payload.partition_times]
    # A union of records needs the branch named explicitly: fastavro's tuple notation.
    return f"{_NAMESPACE}.{payload.type}", data


def _payload_from_avro(branch: str, data: dict[str, Any]) -> Payload:
    name = branch.rsplit(".", 1)[-1]
    if name == "DataWritten":
        data = {**data, "files": [_file_from_avro(f) for f in data["files"]]}
    return _PAYLOAD_TYPES[name].model_validate(data)


def encode(event: Event) -> bytes:
    """Header (magic + version) followed by the schemaless Avro envelope."""
    out = io.BytesIO()
    out.write(_HEADER.pack(MAGIC, VERSION))
    record = {
        "sink": event.sink,
        "event_id": event.event_id,
        "event_time_ms": event.event_time_ms,
        "payload": _payload_to_avro(event.payload),
    }
    fastavro.schemaless_writer(out, envelope_schema(), record)
    return out.getvalue()


def decode(data: bytes) -> Event:
    """Decode one control-topic message; raises :class:`EventVersionError` for foreign or newer data."""
    if len(data) < _HEADER.size:
        raise EventVersionError(f"control message of {len(data)} bytes is too short for a fanout_sink event")
    magic, version = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EventVersionError(
            f"control message does not start with {MAGIC!r} (found {magic!r}): it was not written by "
            "fanout_sink. Give the sink a control topic of its own."
        )
    if version not in READABLE_VERSIONS:
        raise EventVersionError(
            f"control event version {version} is not supported by this fanout_sink (it reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}). Upgrade fanout_sink on every process of the sink "
            "to the same release."
        )
    record: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
        io.BytesIO(data[_HEADER.size :]), envelope_schema(version), envelope_schema(), return_record_name=True
    )
    branch, payload = record["payload"]
    return Event(
        sink=record["sink"],
        event_id=record["event_id"],
        event_time_ms=record["event_time_ms"],
        payload=_payload_from_avro(branch, payload),
    )
