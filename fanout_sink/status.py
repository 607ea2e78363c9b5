"""``fanout-sink status``: what each table holds from the sink, and how far each source partition is.

Everything shown is read from the sources of truth, never from a process's memory, so status works
while the sink is down: table state from snapshot summaries (walking back to this sink's latest
commit), source progress from the sink-managed group against each partition's last stable offset.
A table's size and health come from its metadata only (the current snapshot's totals, the snapshot
log, the maintenance property), so status stays cheap however many files a table has. With
``source.pattern``, the topics are the ones the pattern matches on the broker now, as Spark would
subscribe. ``--json`` is a stable interface, documented field by field in ``docs/status.md``.

Status is what an operator runs when something is wrong, so a broker or a catalog that is down is
an answer, not a traceback: the catalog is read on a thread of its own while the broker is probed,
each gets :data:`ANSWER_TIMEOUT_S` for its first answer, and each that fails is one :class:`Fault`
(one line: what is unreachable, what to check) while the other half is still shown. The exit code
says which half is missing (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow.compute as pc
from confluent_kafka import KafkaException
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.catalog_errors import unreachable
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import CatalogNotFoundError, CatalogSettingsError, PreflightError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import PartitionPosition, source_positions
from fanout_sink.kafka.topics import pattern_topics
from fanout_sink.preflight import Preflight
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import group_layout, recovery, table_state
from fanout_sink.protocol.channel import ControlReader, SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.table_cadence import CommitIntervals, due_ms
from fanout_sink.user_info import split_user_info

ANSWER_TIMEOUT_S = 5.0
"""How long status waits for the broker's first answer, and (meanwhile) for the catalog's."""

Part = Literal["kafka", "catalog"]
EXIT_CODES: dict[frozenset[Part], int] = {
    frozenset(): 0,
    frozenset({"kafka"}): 3,
    frozenset({"catalog"}): 4,
    frozenset({"kafka", "catalog"}): 5,
}
"""``status``'s exit code by the halves it could not read: 3 no lag (Kafka), 4 no tables (the
catalog), 5 neither; 2 stays a config problem, as for every command (README, "Exit codes")."""

_NOT_SHOWN: dict[Part, str] = {"kafka": "lag not shown", "catalog": "tables not shown"}


@dataclass(frozen=True)
class Fault:
    """One half of status that could not be read: what is unreachable, and what to check."""

    part: Part
    cause: str
    fix: str

    def line(self) -> str:
        return f"fanout-sink status: {self.cause} ({_NOT_SHOWN[self.part]}); fix: {self.fix}"


@dataclass(frozen=True)
class TableStatus:
    table: str
    commit_id: str | None
    snapshot_id: int | None
    vtts_ms: int | None
    vtts_age_s: float | None
    """Seconds from the VTTS to the moment status ran: how far behind the table's data may be."""
    control_offsets: dict[int, int]
    committed_at_ms: int | None
    data_files: int
    data_bytes: int
    average_file_bytes: int | None
    delete_files: int
    """Position-delete files of the current snapshot (change tables); maintenance folds them."""
    position_deletes: int
    snapshots: int
    last_maintenance_ms: int | None
    """When ``fanout-sink maintain`` last finished on the table; ``None``: never."""
    commit_interval_s: float | None = None
    """The table's own ``commit-interval``; ``None``: it commits in every round."""
    next_commit_due_ms: int | None = None
    """When its files waiting for that interval are due (:func:`~.table_cadence.due_ms`); ``None``:
    none wait."""


@dataclass(frozen=True)
class PendingTable:
    """A table with files announced on the control topic that it does not hold yet."""

    table: str
    file_events: int
    oldest_control_offset: int
    oldest_written_ms: int | None
    commit_interval_s: float | None = None
    commit_due_ms: int | None = None
    """With an interval of its own: when these files are due (a time passed: at the next round)."""


@dataclass
class SinkStatus:
    sink: str
    control_topic: str
    collected_at_ms: int
    source_pattern: str | None
    source_topics: list[str]
    """``source.topics``, or the topics ``source.pattern`` matches now."""
    tables: list[TableStatus] = field(default_factory=list)
    partitions: list[PartitionPosition] = field(default_factory=list)
    pending: list[PendingTable] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    """The halves not read (their lists above are then empty)."""

    def failed(self, part: Part) -> Fault | None:
        return next((fault for fault in self.faults if fault.part == part), None)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[frozenset(fault.part for fault in self.faults)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for partition, position in zip(data["partitions"], self.partitions, strict=True):
            partition["lag"] = position.lag
        return data


def table_states(catalog: Catalog, sink: str, now_ms: int) -> list[TableStatus]:
    """Every table of the catalog that holds at least one commit of ``sink``."""
    found = []
    for listed in table_state.sink_tables(catalog, sink):
        stats = data_file_stats(listed.table)
        last_run = listed.table.metadata.properties.get(table_state.MAINTENANCE_LAST_RUN_MS)
        vtts = listed.state.vtts_ms
        found.append(
            TableStatus(
                table=listed.identifier,
                commit_id=listed.state.commit_id,
                snapshot_id=listed.state.snapshot_id,
                vtts_ms=vtts,
                vtts_age_s=None if vtts is None else max(0.0, (now_ms - vtts) / 1000),
                control_offsets=listed.state.control_offsets,
                committed_at_ms=listed.state.timestamp_ms,
                data_files=stats.files,
                data_bytes=stats.bytes,
                average_file_bytes=stats.average_bytes,
                delete_files=stats.delete_files,
                position_deletes=stats.position_deletes,
                snapshots=len(listed.table.metadata.snapshots),
                last_maintenance_ms=int(last_run) if last_run is not None else None,
            )
        )
    return found


@dataclass(frozen=True)
class DataFileStats:
    """The data files of a table's current snapshot: how many, their bytes, their rows; and its
    position-delete files with the rows they delete."""

    files: int
    bytes: int
    records: int
    delete_files: int = 0
    position_deletes: int = 0

    @property
    def average_bytes(self) -> int | None:
        return self.bytes // self.files if self.files else None


def data_file_stats(table: Table) -> DataFileStats:
    """From the current snapshot's summary (``total-data-files``, ``total-files-size``,
    ``total-records``, ``total-delete-files``, ``total-position-deletes``), which every Iceberg writer
    keeps: reading it costs nothing, while listing the files means reading every manifest, hundreds
    per table before compaction. A summary without the totals (a writer that omits them) falls back
    to that listing.
    """
    snapshot = table.current_snapshot()
    if snapshot is None:
        return DataFileStats(0, 0, 0)
    summary = snapshot.summary
    totals = [
        summary.get(k) if summary else None for k in ("total-data-files", "total-files-size", "total-records")
    ]
    if all(value is not None for value in totals):
        files, size, records = (int(value) for value in totals if value is not None)
        # Writers that write deletes keep these totals; a table of older appends may lack them: none.
        delete_totals = (
            int(summary.get(k, 0)) if summary else 0 for k in ("total-delete-files", "total-position-deletes")
        )
        return DataFileStats(files, size, records, *delete_totals)
    listed = table.inspect.data_files(snapshot.snapshot_id)
    deletes = table.inspect.delete_files(snapshot.snapshot_id)
    return DataFileStats(
        listed.num_rows,
        int(pc.sum(listed["file_size_in_bytes"]).as_py() or 0),
        int(pc.sum(listed["record_count"]).as_py() or 0),
        deletes.num_rows,
        int(pc.sum(deletes["record_count"]).as_py() or 0),
    )


def pending_tables(catalog: Catalog, channel: SinkChannel) -> list[PendingTable]:
    """Tables still waiting for files: ``DataWritten`` events from the coordinator group's low
    watermark on, at or above the table's stored control offset.

    Cheap while the sink keeps up (the low watermark is then near the end of the control topic). A
    table that stays here round after round is failing; the coordinator logs an ERROR for it each
    round, with the cause.
    """
    reader = ControlReader(channel)
    try:
        try:
            recovery.seek_to_low_watermark(reader)
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
                    catalog.load_table(identifier), channel.sink
                ).next_control_offset()
            except Exception:  # a table that cannot be loaded holds none of them
                floors[identifier] = 0
        if item.offset >= floors[identifier]:
            found.setdefault(identifier, []).append((item.offset, item.event.event_time_ms))
    return [
        PendingTable(table, len(items), items[0][0], items[0][1]) for table, items in sorted(found.items())
    ]


def with_cadence(status: SinkStatus, intervals: CommitIntervals) -> None:
    """Each table's own ``commit-interval`` and, for the pending ones, when their files are due."""
    due: dict[str, int] = {}
    for i, pending in enumerate(status.pending):
        interval = intervals.interval_s(pending.table)
        if interval is not None and pending.oldest_written_ms is not None:
            due[pending.table] = due_ms(
                pending.table, interval, pending.oldest_written_ms, status.collected_at_ms
            )
        status.pending[i] = replace(pending, commit_interval_s=interval, commit_due_ms=due.get(pending.table))
    status.tables = [
        replace(t, commit_interval_s=intervals.interval_s(t.table), next_commit_due_ms=due.get(t.table))
        for t in status.tables
    ]


def subscribed_topics(clients: KafkaClientFactory, topics: list[str], pattern: str | None) -> list[str]:
    """``source.topics`` as configured, or what ``source.pattern`` matches on the broker now."""
    if pattern is None:
        return list(topics)
    names = clients.admin().list_topics(timeout=clients.timeout_s).topics
    return pattern_topics(pattern, names)


def catalog_fault(settings: CatalogSettings, exc: BaseException | None, timeout_s: float = 0) -> Fault:
    """The catalog half's fault: not there (a SQLite file), no answer in time, or its error."""
    if isinstance(exc, CatalogNotFoundError | CatalogSettingsError):
        return Fault("catalog", exc.cause, exc.fix)
    uri = split_user_info(settings.uri)[0] if settings.uri else "not set"
    where = f"catalog {settings.name!r} (catalog.type={settings.type}, catalog.uri={uri})"
    fix = "check catalog.uri, that the catalog's service runs and this host reaches it, and its credentials"
    if exc is None:
        return Fault("catalog", f"{where} did not answer within {timeout_s:.0f} s", fix)
    return Fault("catalog", f"{where} is unreachable: {unreachable(exc)}", fix)


class CatalogRead:
    """The catalog half of status, started at once on a thread of its own so that a catalog that does
    not answer costs :data:`ANSWER_TIMEOUT_S` in parallel with the broker's probe, not its client's
    own timeouts and retries. Only its first answer is timed: listing a large catalog may take long."""

    def __init__(self, settings: CatalogSettings, sink: str, now_ms: int) -> None:
        self.settings = settings
        self._answered = threading.Event()
        self._done = threading.Event()
        self._catalog: Catalog | None = None
        self._tables: list[TableStatus] = []
        self._error: BaseException | None = None
        args = (sink, now_ms)
        threading.Thread(target=self._read, args=args, name="fanout-sink-status-catalog", daemon=True).start()

    def _read(self, sink: str, now_ms: int) -> None:
        try:
            catalog = load_catalog(self.settings, create=False)
            catalog.list_namespaces()
            self._answered.set()
            self._tables = table_states(catalog, sink, now_ms)
            self._catalog = catalog
        except Exception as exc:  # any catalog's own error is this half's fault, reported in one line
            self._error = exc
        finally:
            self._answered.set()
            self._done.set()

    def result(self, timeout_s: float) -> tuple[Catalog | None, list[TableStatus], Fault | None]:
        """The catalog and the sink's tables, or the fault (after ``timeout_s`` without an answer)."""
        if not self._answered.wait(timeout_s):
            return None, [], catalog_fault(self.settings, None, timeout_s)
        self._done.wait()
        if self._catalog is None:
            return None, [], catalog_fault(self.settings, self._error)
        return self._catalog, self._tables, None


_KAFKA_FIX = "run `fanout-sink validate --config <sink.yaml>`: it names the broker's problem"


def broker_fault(config: SinkConfig, timeout_s: float = ANSWER_TIMEOUT_S) -> Fault | None:
    """The broker's answer to a metadata request, as ``run``'s pre-flight asks it (the same causes:
    unreachable, credentials refused, TLS), within ``timeout_s``; None when it answers."""
    try:
        Preflight(config, timeout_s).metadata()
    except PreflightError as exc:
        return Fault("kafka", exc.cause, exc.fix)
    return None


def collect_status(
    channel: SinkChannel,
    catalog_read: CatalogRead,
    source_topics: list[str],
    source_pattern: str | None = None,
    kafka_fault: Fault | None = None,
    now_ms: int | None = None,
    timeout_s: float = ANSWER_TIMEOUT_S,
    intervals: CommitIntervals | None = None,
) -> SinkStatus:
    """Both halves: the source positions unless ``kafka_fault`` (the broker's probe failed), and
    what ``catalog_read`` found; the pending tables need both. ``intervals``: the tables' own
    ``commit-interval`` (none: every table commits every round)."""
    status = SinkStatus(
        sink=channel.sink,
        control_topic=channel.control_topic,
        collected_at_ms=now_ms if now_ms is not None else int(time.time() * 1000),
        source_pattern=source_pattern,
        source_topics=list(source_topics),
    )
    if kafka_fault is None:
        try:
            status.source_topics = subscribed_topics(channel.clients, source_topics, source_pattern)
            status.partitions = source_positions(channel.clients, channel.sink_group, status.source_topics)
        except KafkaException as exc:  # it answered the probe, then failed: the same one line
            kafka_fault = Fault(
                "kafka", f"Kafka failed while status read it: {exc.args[0].str()}", _KAFKA_FIX
            )
    if kafka_fault is not None:
        status.faults.append(kafka_fault)
    catalog, status.tables, fault = catalog_read.result(timeout_s)
    if fault is not None:
        status.faults.append(fault)
    if catalog is not None and kafka_fault is None:
        status.pending = pending_tables(catalog, channel)
    with_cadence(status, intervals or CommitIntervals())
    return status


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="seconds")


def _scaled(value: float, units: tuple[tuple[str, float], ...], smallest: str) -> str:
    """``value`` in the largest of ``units`` it reaches, one decimal; else whole ``smallest`` units."""
    for unit, scale in units:
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} {smallest}"


def _size(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else _scaled(num_bytes, (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)), "B")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f" ({_scaled(seconds, (('d', 86400), ('h', 3600), ('min', 60)), 's')} ago)"


def _cadence(interval_s: float | None) -> str:
    if interval_s is None:
        return "commits every round"
    return f"commits every {_scaled(interval_s, (('d', 86400), ('h', 3600), ('min', 60)), 's')}"


def render_text(status: SinkStatus) -> str:
    lines = [f"sink {status.sink} (control topic {status.control_topic})", "", "tables:"]
    if status.failed("catalog"):
        lines.append("  (not read: see the catalog line above)")
    elif not status.tables:
        lines.append("  (no table holds a commit of this sink yet)")
    for t in status.tables:
        offsets = json.dumps({str(p): o for p, o in t.control_offsets.items()})
        maintained = "never" if t.last_maintenance_ms is None else _time(t.last_maintenance_ms)
        lines += [
            f"  {t.table}: commit {t.commit_id} snapshot {t.snapshot_id} at {_time(t.committed_at_ms)} "
            f"vtts {_time(t.vtts_ms)}{_age(t.vtts_age_s)} control-offsets {offsets}",
            f"    {t.data_files} data files, average {_size(t.average_file_bytes)}, "
            + (f"{t.delete_files} delete files ({t.position_deletes} rows), " if t.delete_files else "")
            + f"{t.snapshots} snapshots, last maintenance {maintained}, {_cadence(t.commit_interval_s)}"
            + ("" if t.next_commit_due_ms is None else f", waiting files due {_time(t.next_commit_due_ms)}"),
        ]
    if status.pending:
        lines += ["", "pending (announced on the control topic, not in the table yet):"]
    for pending in status.pending:
        lines.append(
            f"  {pending.table}: {pending.file_events} file event(s), the oldest at control offset "
            f"{pending.oldest_control_offset} written {_time(pending.oldest_written_ms)}"
            + ("" if pending.commit_due_ms is None else f", due {_time(pending.commit_due_ms)}")
        )
    lines += ["", "source partitions:"]
    if status.source_pattern is not None:
        # Each matched topic is named with its partitions below: a database's thousand topics once.
        count = len(status.source_topics)
        topics = "1 topic" if count == 1 else f"{count} topics"
        lines.append(f"  pattern {status.source_pattern} matches {topics} now")
    if status.failed("kafka"):
        lines.append("  (not read: see the Kafka line above)")
    elif not status.partitions:
        lines.append("  (no source topic found)")
    for p in status.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        lines.append(f"  {p.topic}[{p.partition}]: committed {committed} end {p.end} lag {p.lag}")
    return "\n".join(lines)


def run(config_path: Path, as_json: bool, timeout_s: float = ANSWER_TIMEOUT_S) -> tuple[str, SinkStatus]:
    """What ``fanout-sink status`` prints on standard output, and the status (its faults, one line
    each for standard error, and its exit code).

    The config is loaded as the app loads it (``${ENV_VAR}`` references resolved, e.g. a SASL password),
    so status reaches the same cluster and catalog the same way.
    """
    config = load_config(config_path)
    now_ms = int(time.time() * 1000)
    catalog_read = CatalogRead(config.catalog, config.name, now_ms)
    kafka_fault = broker_fault(config, timeout_s)
    channel = (
        group_layout.channel_in_use(config)
        if kafka_fault is None
        else SinkChannel.from_config(config, PartitionGroups())  # its layout is on the broker
    )
    status = collect_status(
        channel,
        catalog_read,
        config.source.topics,
        config.source.pattern,
        kafka_fault,
        now_ms,
        timeout_s,
        CommitIntervals.of(config),
    )
    return (json.dumps(status.to_json(), indent=2) if as_json else render_text(status)), status
