"""``fanout-sink status``: what each table holds from the sink, and how far each source partition is.

Everything shown is read from the sources of truth, never from a process's memory, so status works
while the sink is down: table state from snapshot summaries (walking back to this sink's latest
commit), source progress from the sink-managed group against each partition's last stable offset.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from pyiceberg.catalog import Catalog

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config import load_config
from fanout_sink.kafka.client import KafkaConf
from fanout_sink.kafka.offsets import PartitionPosition, source_positions
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import table_state
from fanout_sink.protocol.channel import ControlReader, sink_group


@dataclass(frozen=True)
class TableStatus:
    table: str
    commit_id: str | None
    snapshot_id: int | None
    vtts_ms: int | None
    control_offsets: dict[int, int]
    committed_at_ms: int | None


@dataclass(frozen=True)
class PendingTable:
    """A table with files announced on the control topic that it does not hold yet."""

    table: str
    file_events: int
    oldest_control_offset: int
    oldest_written_ms: int | None


@dataclass
class SinkStatus:
    sink: str
    control_topic: str
    tables: list[TableStatus] = field(default_factory=list)
    partitions: list[PartitionPosition] = field(default_factory=list)
    pending: list[PendingTable] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for partition, position in zip(data["partitions"], self.partitions, strict=True):
            partition["lag"] = position.lag
        return data


def table_states(catalog: Catalog, sink: str) -> list[TableStatus]:
    """Every table of the catalog that holds at least one commit of ``sink``."""
    return [
        TableStatus(
            table=found.identifier,
            commit_id=found.state.commit_id,
            snapshot_id=found.state.snapshot_id,
            vtts_ms=found.state.vtts_ms,
            control_offsets=found.state.control_offsets,
            committed_at_ms=found.state.timestamp_ms,
        )
        for found in table_state.sink_tables(catalog, sink)
    ]


def pending_tables(
    catalog: Catalog, sink: str, kafka_conf: KafkaConf, control_topic: str
) -> list[PendingTable]:
    """Tables still waiting for files: ``DataWritten`` events from the coordinator group's low
    watermark on, at or above the table's stored control offset.

    Cheap while the sink keeps up (the low watermark is then near the end of the control topic). A
    table that stays here round after round is failing; the coordinator logs an ERROR for it each
    round, with the cause.
    """
    reader = ControlReader(sink, kafka_conf, control_topic)
    try:
        try:
            reader.seek_to_committed()
        except KafkaException:  # no control topic yet: nothing was announced
            return []
        events = list(reader.read_until(reader.end_offset()))
    finally:
        reader.close()
    floors: dict[str, int] = {}
    found: dict[str, list[tuple[int, int]]] = {}
    for item in events:
        payload = item.event.payload
        if not isinstance(payload, ev.DataWritten):
            continue
        identifier = payload.table.identifier
        if identifier not in floors:
            try:
                floors[identifier] = table_state.read_state(
                    catalog.load_table(identifier), sink
                ).next_control_offset()
            except Exception:  # a table that cannot be loaded holds none of them
                floors[identifier] = 0
        if item.offset >= floors[identifier]:
            found.setdefault(identifier, []).append((item.offset, item.event.event_time_ms))
    return [
        PendingTable(table, len(items), items[0][0], items[0][1]) for table, items in sorted(found.items())
    ]


def collect_status(
    sink: str,
    kafka_conf: KafkaConf,
    control_topic: str,
    catalog_settings: CatalogSettings,
    source_topics: list[str],
) -> SinkStatus:
    catalog = load_catalog(catalog_settings)
    return SinkStatus(
        sink=sink,
        control_topic=control_topic,
        tables=table_states(catalog, sink),
        partitions=source_positions(kafka_conf, sink_group(sink), source_topics),
        pending=pending_tables(catalog, sink, kafka_conf, control_topic),
    )


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="seconds")


def render_text(status: SinkStatus) -> str:
    lines = [f"sink {status.sink} (control topic {status.control_topic})", "", "tables:"]
    if not status.tables:
        lines.append("  (no table holds a commit of this sink yet)")
    for t in status.tables:
        offsets = json.dumps({str(p): o for p, o in t.control_offsets.items()})
        lines.append(
            f"  {t.table}: commit {t.commit_id} snapshot {t.snapshot_id} at {_time(t.committed_at_ms)} "
            f"vtts {_time(t.vtts_ms)} control-offsets {offsets}"
        )
    if status.pending:
        lines += ["", "pending (announced on the control topic, not in the table yet):"]
    for pending in status.pending:
        lines.append(
            f"  {pending.table}: {pending.file_events} file event(s), the oldest at control offset "
            f"{pending.oldest_control_offset} written {_time(pending.oldest_written_ms)}"
        )
    lines += ["", "source partitions:"]
    if not status.partitions:
        lines.append("  (no source topic found)")
    for p in status.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        lines.append(f"  {p.topic}[{p.partition}]: committed {committed} end {p.end} lag {p.lag}")
    return "\n".join(lines)


def run(config_path: Path, as_json: bool) -> str:
    """What ``fanout-sink status`` prints.

    The config is loaded as the app loads it (``${ENV_VAR}`` references resolved, e.g. a SASL password),
    so status reaches the same cluster and catalog the same way.
    """
    config = load_config(config_path)
    status = collect_status(
        config.name, dict(config.kafka), config.control_topic, config.catalog, config.source.topics
    )
    return json.dumps(status.to_json(), indent=2) if as_json else render_text(status)
