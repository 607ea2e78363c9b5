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

import yaml

from fanout_sink import table_state
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.errors import FanoutSinkError
from fanout_sink.source_offsets import PartitionPosition, source_positions


@dataclass(frozen=True)
class StatusConfig:
    """The few config keys status needs (until the full config model is wired in)."""

    name: str
    kafka: dict[str, Any]
    control_topic: str
    source_topics: list[str]
    catalog: CatalogSettings


def load_status_config(path: Path) -> StatusConfig:
    """Reads only ``name``, ``kafka``, ``control.topic``, ``source.topics`` and ``catalog`` from YAML."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise FanoutSinkError(
            f"cannot read config {path}: {exc.strerror}\n  fix: pass --config FILE"
        ) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise FanoutSinkError(f"{path}: `name` (the sink name) is missing\n  fix: add `name: <sink name>`")
    name = raw["name"]
    control = raw.get("control") or {}
    source = raw.get("source") or {}
    return StatusConfig(
        name=name,
        kafka={str(k): v for k, v in (raw.get("kafka") or {}).items()},
        control_topic=str(control.get("topic") or f"{name}-control"),
        source_topics=[str(t) for t in (source.get("topics") or [])],
        catalog=CatalogSettings(**(raw.get("catalog") or {})),
    )


@dataclass(frozen=True)
class TableStatus:
    table: str
    commit_id: str | None
    snapshot_id: int | None
    vtts_ms: int | None
    control_offsets: dict[int, int]
    committed_at_ms: int | None


@dataclass
class SinkStatus:
    sink: str
    control_topic: str
    tables: list[TableStatus] = field(default_factory=list)
    partitions: list[PartitionPosition] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for partition, position in zip(data["partitions"], self.partitions, strict=True):
            partition["lag"] = position.lag
        return data


def table_states(catalog: Any, sink: str) -> list[TableStatus]:
    """Every table of the catalog that holds at least one commit of ``sink``."""
    found = []
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            table = catalog.load_table(identifier)
            state = table_state.read_state(table, sink)
            if state.snapshot_id is None:
                continue
            found.append(
                TableStatus(
                    table=".".join(identifier),
                    commit_id=state.commit_id,
                    snapshot_id=state.snapshot_id,
                    vtts_ms=state.vtts_ms,
                    control_offsets=state.control_offsets,
                    committed_at_ms=state.timestamp_ms,
                )
            )
    return sorted(found, key=lambda t: t.table)


def collect_status(
    sink: str,
    kafka_conf: dict[str, Any],
    control_topic: str,
    catalog_settings: CatalogSettings,
    source_topics: list[str],
) -> SinkStatus:
    return SinkStatus(
        sink=sink,
        control_topic=control_topic,
        tables=table_states(load_catalog(catalog_settings), sink),
        partitions=source_positions(kafka_conf, sink, source_topics),
    )


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat(timespec="seconds")


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
    lines += ["", "source partitions:"]
    if not status.partitions:
        lines.append("  (no source topic found)")
    for p in status.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        lines.append(f"  {p.topic}[{p.partition}]: committed {committed} end {p.end} lag {p.lag}")
    return "\n".join(lines)


def run(config_path: Path, as_json: bool) -> str:
    """What ``fanout-sink status`` prints."""
    config = load_status_config(config_path)
    status = collect_status(
        config.name, config.kafka, config.control_topic, config.catalog, config.source_topics
    )
    return json.dumps(status.to_json(), indent=2) if as_json else render_text(status)
