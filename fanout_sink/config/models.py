"""The sink's YAML configuration as typed, validated pydantic models (:class:`SinkConfig`).

Key names follow the YAML (``commit-interval``, ``dead-letter``); Python attributes use snake case.
Sections ``kafka``, ``catalog`` and ``source.schema-registry`` pass their keys through unchanged
(librdkafka, PyIceberg and Schema Registry client property names). Secrets in them are named by
:func:`~fanout_sink.config.secrets.is_secret_key`; :meth:`SinkConfig.redacted` and ``repr``/``str``
of a config hide them. Reading a YAML file into these models is
:mod:`~fanout_sink.config.loading`'s job.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import jmespath
from pydantic import (
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.secrets import redact
from fanout_sink.kafka.java_client import sasl_jaas_config
from fanout_sink.kafka.topics import TopicSettings
from fanout_sink.logs import LogFormat, LogLevel

# --------------------------------------------------------------------------------------------
# Small value types


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> timedelta:
    """``30s``, ``5m``, ``1h``, ``250ms``, ``2d``; a bare number is seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}; write a number with a unit, e.g. 30s, 5m or 1h")
    if isinstance(value, int | float):
        return timedelta(seconds=float(value))
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r}; write a number with a unit, e.g. 30s, 5m or 1h")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"])


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]

_IDENT_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_jmespath(value: str | None, example: str) -> str | None:
    if value is None:
        return None
    try:
        jmespath.compile(value)
    except jmespath.exceptions.JMESPathError as exc:
        detail = str(exc).splitlines()[0]
        raise ValueError(f"not a valid jmespath expression {value!r} ({detail}); e.g. {example}") from None
    return value


_TRANSFORM = re.compile(
    r"^\s*(?:(?P<name>identity|year|month|day|hour|bucket|truncate)"
    r"\s*(?:\[\s*(?P<arg>\d+)\s*\])?\s*\(\s*(?P<col>[A-Za-z_][\w.]*)\s*\)"
    r"|(?P<bare>[A-Za-z_][\w.]*))\s*$"
)
TRANSFORM_HELP = 'use one of identity, bucket[N], truncate[W], year, month, day, hour, e.g. "day(ts)"'


class PartitionField(BaseModel):
    """One parsed ``partition-by`` entry: ``day(ts)``, ``bucket[16](id)``, ``truncate[4](name)``, ``id``."""

    model_config = ConfigDict(frozen=True)

    transform: Literal["identity", "year", "month", "day", "hour", "bucket", "truncate"]
    column: str
    argument: int | None = None

    @classmethod
    def parse(cls, text: str) -> PartitionField:
        match = _TRANSFORM.match(text)
        if not match:
            raise ValueError(f"unknown transform {text!r}; {TRANSFORM_HELP}")
        if match.group("bare"):
            return cls(transform="identity", column=match.group("bare"))
        name, arg = match.group("name"), match.group("arg")
        if name in {"bucket", "truncate"} and arg is None:
            letter = "N" if name == "bucket" else "W"
            raise ValueError(f"{name} needs a width: {name}[{letter}](column), e.g. {name}[16](id)")
        if name not in {"bucket", "truncate"} and arg is not None:
            raise ValueError(f"{name} takes no width; e.g. {name}({match.group('col')})")
        if arg is not None and int(arg) <= 0:
            raise ValueError(f"{name} width must be positive; e.g. {name}[16]({match.group('col')})")
        return cls.model_validate(
            {"transform": name, "column": match.group("col"), "argument": int(arg) if arg else None}
        )

    def __str__(self) -> str:
        arg = f"[{self.argument}]" if self.argument is not None else ""
        return f"{self.transform}{arg}({self.column})"


def _parse_partition(value: Any) -> Any:
    return PartitionField.parse(value) if isinstance(value, str) else value


def _listify_partitions(value: Any) -> Any:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


PartitionBy = Annotated[
    list[Annotated[PartitionField, BeforeValidator(_parse_partition)]],
    BeforeValidator(_listify_partitions),
]


def check_table_identifier(value: str) -> str:
    parts = value.split(".")
    if len(parts) < 2 or not all(_IDENT_PART.match(p) for p in parts):
        raise ValueError(
            f"not a table identifier {value!r}; write <namespace>.<table> with letters, digits and _, "
            'e.g. "analytics.orders"'
        )
    return value


# --------------------------------------------------------------------------------------------
# Sections


class _Section(BaseModel):
    """YAML keys are kebab-case; unknown keys are errors (they are usually typos)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=AliasGenerator(validation_alias=lambda name: name.replace("_", "-")),
    )


class SourceSettings(_Section):
    """``source:`` which topics to read and how their values are encoded."""

    topics: list[str] = Field(default_factory=list, examples=[["orders", "payments"]])
    pattern: str | None = Field(default=None, examples=["^shop\\..*"])
    format: Literal["json", "avro", "confluent-avro", "confluent-protobuf", "confluent-json-schema"] = Field(
        default="json", examples=["json"]
    )
    schema_file: str | None = Field(default=None, validation_alias="schema", examples=["schemas/order.avsc"])
    schema_registry: dict[str, str] = Field(default_factory=dict, examples=[{"url": "http://127.0.0.1:8081"}])
    unknown_schema_id_timeout: Duration = Field(default=timedelta(minutes=5), examples=["5m"])
    """Registry formats: how long a schema id the Schema Registry answers 404 for (a lagging
    follower, a restore) fails the batch, which is retried, before the values naming it are
    dead-lettered. Counted from when the sink first saw the id unknown."""
    tombstones: Literal["skip", "dead-letter"] = Field(default="skip", examples=["skip"])
    starting_offsets: Literal["earliest", "latest"] = Field(default="earliest", examples=["earliest"])
    recreated_topic_offsets: Literal["earliest", "fail"] = Field(default="earliest", examples=["earliest"])
    """A source topic deleted and created again (its topic id changed): read it from its beginning,
    or stop with an error naming it (see routing/README.md for why ``earliest`` is the default)."""

    @field_validator("schema_registry", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check(self) -> SourceSettings:
        if not self.topics and not self.pattern:
            raise ValueError("give topics or pattern; e.g. topics: [orders, payments]")
        if self.topics and self.pattern:
            raise ValueError("give topics or pattern, not both; e.g. topics: [orders, payments]")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern is not a regular expression ({exc}); e.g. '^shop\\..*'") from None
        if self.format == "avro" and not self.schema_file:
            raise ValueError("format avro needs schema: <file.avsc>; e.g. schema: schemas/order.avsc")
        if self.unknown_schema_id_timeout < timedelta(0):
            raise ValueError(
                "unknown-schema-id-timeout must not be negative; e.g. unknown-schema-id-timeout: 5m"
            )
        if self.format.startswith("confluent-") and "url" not in self.schema_registry:
            raise ValueError(
                f"format {self.format} needs schema-registry.url; e.g. schema-registry: {{url: http://127.0.0.1:8081}}"
            )
        return self


class _ReplicatedTopic(_Section):
    """Replication of one of the sink's own topics. Unset: as durable as the source offsets (the
    broker's ``offsets.topic.replication.factor`` and ``transaction.state.log.min.isr``, capped at
    the number of brokers); an existing topic below these values stops the sink at start."""

    replication_factor: int | None = Field(default=None, ge=1, examples=[3])
    min_insync_replicas: int | None = Field(default=None, ge=1, examples=[2])

    @model_validator(mode="after")
    def _replicas(self) -> _ReplicatedTopic:
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise ValueError(
                f"min-insync-replicas {isr} is more than replication-factor {rf}: no write could ever "
                f"succeed; e.g. replication-factor: 3, min-insync-replicas: 2"
            )
        return self


DEFAULT_CONTROL_RETENTION_MS = 7 * 24 * 3600 * 1000
"""7 days: Kafka's own default ``log.retention.hours`` and ``offsets.retention.minutes``, so the
control topic forgets no sooner than the broker forgets the sink's group offsets."""
MIN_CONTROL_RETENTION_MS = 3600 * 1000


class ControlSettings(_ReplicatedTopic):
    """``control:`` the sink's control topic and its commit cadence.

    The control topic grows by one record per data file (its column statistics) plus a few events per
    round. A restart reads only its tail: the events a table still needs (from the low watermark on)
    and the newest whole round, which carries every delivered position forward. So it is created with
    a finite retention (``retention-ms``, Kafka's ``retention.ms``: 7 days by default; -1 keeps every
    event) and ``cleanup.policy=delete``. What that retention must outlast: a table failing round
    after round (its events stay pending) and a sink down after a crash that left events pending; a
    sink stopped cleanly may stay down longer (docs/design.md, "The control topic's tail").
    """

    topic: str | None = Field(default=None, examples=["shop-events-control"])
    commit_interval: Duration = Field(default=timedelta(seconds=30), examples=["30s"])
    commit_min_interval: Duration = Field(default=timedelta(seconds=2), examples=["2s"])
    """The shortest time between the starts of two commit rounds. A round starts as soon as every
    planned range of a micro-batch has reported (``commit-interval`` is only the upper bound), so
    without a floor a backlog read in many small batches would make a snapshot per table every few
    hundred milliseconds. Capped at ``commit-interval``."""
    commit_timeout: Duration = Field(default=timedelta(seconds=60), examples=["60s"])
    distributed_commit_min_tables: int = Field(default=50, ge=1, examples=[50])
    """A round committing at least this many tables runs its table commits as one Spark job over the
    executors' cores (spark/executor_commits.py); smaller rounds commit on the driver, where a job's
    scheduling would cost more than it spreads."""
    offsets_refresh_interval: Duration | None = Field(default=None, examples=["6h"])
    """How often the coordinator re-commits an idle partition's sink-group offset (the group is never
    joined, so the broker expires each offset ``offsets.retention.minutes`` after its last commit).
    Unset: a quarter of the broker's ``offsets.retention.minutes``."""
    retention_ms: int = Field(default=DEFAULT_CONTROL_RETENTION_MS, ge=-1, examples=[604800000, -1])
    """Kafka's ``retention.ms`` for a control topic the sink creates; -1 keeps every event. At
    least an hour when finite: rounds run every ``commit-interval`` and each one's events must
    survive until the next restart reads them."""
    retention_bytes: int = Field(default=-1, ge=-1, examples=[-1])

    @model_validator(mode="after")
    def _check_cadence(self) -> ControlSettings:
        if 0 <= self.retention_ms < MIN_CONTROL_RETENTION_MS:
            raise ValueError(
                f"retention-ms {self.retention_ms} is shorter than an hour: a restart reads the control "
                "topic's events since the last round, and a table that fails for a few rounds holds "
                "events back; e.g. retention-ms: 604800000 (7 days), or -1 to keep every event"
            )
        if "commit_min_interval" in self.model_fields_set and self.commit_min_interval > self.commit_interval:
            raise ValueError(
                f"commit-min-interval ({self.commit_min_interval}) is longer than commit-interval "
                f"({self.commit_interval}): rounds could never be that far apart; e.g. commit-interval: "
                "30s, commit-min-interval: 2s"
            )
        return self

    def topic_settings(self) -> TopicSettings:
        """How the control topic is created and checked (never compacted: every event counts)."""
        return TopicSettings(
            section="control",
            config={
                "cleanup.policy": "delete",
                "retention.ms": str(self.retention_ms),
                "retention.bytes": str(self.retention_bytes),
            },
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )


class EvolutionSettings(_Section):
    """``evolution:`` which schema changes the sink may make to a table on its own."""

    add_columns: bool = Field(default=False, examples=[True])
    widen_types: bool = Field(default=False, examples=[True])
    make_optional: bool = Field(default=False, examples=[True])

    @classmethod
    def all_on(cls) -> EvolutionSettings:
        return cls(add_columns=True, widen_types=True, make_optional=True)


def _evolution(value: Any) -> Any:
    if value is True:
        return EvolutionSettings.all_on()
    if value is False or value is None:
        return EvolutionSettings()
    return value


Evolution = Annotated[EvolutionSettings, BeforeValidator(_evolution)]


class ConversionSettings(_Section):
    """How a table's columns find their values: name mapping and case-insensitive matching."""

    name_mapping: dict[str, list[str]] = Field(
        default_factory=dict, examples=[{"customer_id": ["customerId", "cust_id"]}]
    )
    case_insensitive: bool = Field(default=False, examples=[True])
    infer_timestamps: bool = Field(default=True, examples=[False])
    """Inferred schemas offer ISO-8601 strings and epoch-ms time fields as timestamps (inference.py)."""

    @field_validator("name_mapping", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
        return value


_SORT_TERM = re.compile(r"^\s*[A-Za-z_][\w.]*(\s+(asc|desc))?(\s+nulls\s+(first|last))?\s*$", re.IGNORECASE)


class MaintenanceSettings(_Section):
    """``maintenance:`` (defaults for every table of the sink) and ``tables.<t>.maintenance:``
    (overrides of the same keys): compaction, manifest rewrite, snapshot expiry and orphan cleanup.

    Key names are Iceberg's where Iceberg has one. ``interval`` set: ``run`` also maintains the tables
    on that schedule; unset: only ``fanout-sink maintain`` does. ``target-file-size-bytes`` unset: the
    table's ``write.target-file-size-bytes`` (else Iceberg's 512 MB); ``max-snapshot-age`` and
    ``min-snapshots-to-keep`` unset: the table's ``history.expire.max-snapshot-age-ms`` and
    ``history.expire.min-snapshots-to-keep`` (else 5 days and 1, Iceberg's defaults).

    Change tables (merge-on-read position deletes): compaction also rewrites a data file with at least
    ``delete-file-threshold`` delete files, or whose file-scoped deletes cover at least
    ``delete-ratio-threshold`` of its rows (Iceberg's ``rewrite_data_files`` options). The default 1
    folds every delete at each run, unlike Iceberg's (never): PyIceberg reads all delete files of a
    scan and cannot push filters into data files that have deletes, so each delete left costs every
    reader, and a table that keeps receiving changes would otherwise grow delete files without end.
    Raise it for large tables with sparse changes, where rewriting a file for a few deletes costs more
    than reading them.
    """

    interval: Duration | None = Field(default=None, examples=["1h"])
    target_file_size_bytes: int | None = Field(default=None, ge=1, examples=[134217728])
    min_input_files: int = Field(default=5, ge=1, examples=[5])
    sort_order: str | None = Field(default=None, examples=["ts, id DESC NULLS LAST"])
    rewrite_manifests_min_count: int = Field(default=100, ge=1, examples=[100])
    max_snapshot_age: Duration | None = Field(default=None, examples=["5d"])
    min_snapshots_to_keep: int | None = Field(default=None, ge=1, examples=[1])
    orphan_older_than: Duration = Field(default=timedelta(days=3), examples=["3d"])
    delete_file_threshold: int = Field(default=1, ge=1, examples=[1])
    delete_ratio_threshold: float = Field(default=0.3, gt=0, le=1, examples=[0.3])

    @field_validator("interval", "orphan_older_than")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"must be positive, not {value.total_seconds():g}s; e.g. 1h")
        return value

    @field_validator("max_snapshot_age")
    @classmethod
    def _not_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError(f"must not be negative, not {value.total_seconds():g}s; e.g. 5d")
        return value

    @field_validator("sort_order")
    @classmethod
    def _sort_order(cls, value: str | None) -> str | None:
        if value is not None and not all(_SORT_TERM.match(term) for term in value.split(",")):
            raise ValueError(
                f"not a sort order {value!r}; write columns with optional ASC|DESC and NULLS FIRST|LAST, "
                'e.g. "ts, id DESC NULLS LAST"'
            )
        return value

    def overridden_by(self, other: MaintenanceSettings | None) -> MaintenanceSettings:
        """These settings with the keys ``other`` sets explicitly (a table's own section) replaced."""
        if other is None:
            return self
        return self.model_copy(update={name: getattr(other, name) for name in other.model_fields_set})


class ChangeSettings(_Section):
    """``changes:`` the table holds each key's latest state instead of every record (CDC, upsert).

    ``format: upsert``: each record replaces the row with its key; a record for which ``delete-when``
    is true deletes its key instead. ``format: debezium``: the record is a Debezium change event
    (``op``, ``before``, ``after``); ``when`` reads the event, ``select`` the row image. ``key`` names
    the table's key columns (top-level, primitive), which become its identifier fields; unset, they
    are the fields of each record's Kafka message key (a JSON object, as Debezium keys every event
    by the row's primary key), so one ``dynamic`` route replicates tables of different keys.
    """

    format: Literal["upsert", "debezium"] = Field(examples=["debezium"])
    key: list[str] | None = Field(default=None, min_length=1, examples=[["id"]])
    delete_when: str | None = Field(default=None, examples=["status == 'closed'"])
    """Evaluated on the record as ``when`` sees it (before ``select``), so a flag the table does
    not keep can still mark deletes."""

    @field_validator("key")
    @classmethod
    def _key(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for name in value:
            if not _IDENT_PART.match(name):
                raise ValueError(
                    f"key column {name!r} is not a top-level column name (letters, digits, _); "
                    "key columns are top-level and primitive, e.g. key: [id]"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"key {value} names a column twice; e.g. key: [tenant, id]")
        return value

    @field_validator("delete_when")
    @classmethod
    def _delete_when(cls, value: str | None) -> str | None:
        return _check_jmespath(value, "\"status == 'closed'\"")

    @model_validator(mode="after")
    def _check(self) -> ChangeSettings:
        if self.format == "debezium" and self.delete_when is not None:
            raise ValueError(
                "delete-when is only for format upsert: Debezium events say deletes themselves (op d); "
                "remove delete-when"
            )
        return self


class TableSettings(_Section):
    """One entry of ``tables:``, keyed ``<namespace>.<table>``."""

    when: str | None = Field(default=None, examples=["type == 'order'"])
    select: str | None = Field(default=None, examples=["{id: id, customer: customer.id}"])
    partition_by: PartitionBy = Field(default_factory=list, examples=[["day(ts)"]])
    schema_file: str | None = Field(
        default=None, validation_alias="schema", examples=["schemas/tables/orders.avsc"]
    )
    properties: dict[str, str] = Field(default_factory=dict, examples=[{"write.format.default": "parquet"}])
    auto_create: bool = Field(default=True, examples=[True])
    evolution: Evolution = Field(default_factory=EvolutionSettings, examples=[{"add-columns": True}])
    conversion: ConversionSettings = Field(default_factory=ConversionSettings)
    maintenance: MaintenanceSettings | None = Field(default=None, examples=[{"min-input-files": 10}])
    changes: ChangeSettings | None = Field(default=None, examples=[{"format": "debezium", "key": ["id"]}])
    """Unset: an append table (every routed record is a new row)."""

    @field_validator("when")
    @classmethod
    def _when(cls, value: str | None) -> str | None:
        return _check_jmespath(value, "\"type == 'order'\"")

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        return _check_jmespath(value, '"{id: id, customer: customer.id}"')

    @field_validator("properties", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value


class UnmatchedSettings(_Section):
    """``unmatched:`` what happens to a record that no static rule and no dynamic name routes."""

    action: Literal["drop", "table", "dead-letter"] = Field(default="drop", examples=["drop"])
    table: str | None = Field(default=None, examples=["analytics.other"])

    @model_validator(mode="after")
    def _check(self) -> UnmatchedSettings:
        if self.action == "table" and not self.table:
            raise ValueError("action table needs table: <ns>.<table>; e.g. table: analytics.other")
        if self.table is not None:
            check_table_identifier(self.table)
        return self


class DynamicSettings(_Section):
    """``dynamic:`` table names computed per record by a jmespath expression."""

    table: str = Field(examples=["join('.', ['raw', topic])"])
    allow: str | None = Field(default=None, examples=["^raw\\.[a-z0-9_]+$"])
    auto_create: bool = Field(default=False, examples=[True])
    applies_to: Literal["unmatched", "all"] = Field(default="unmatched", examples=["unmatched"])
    max_namespace_depth: int = Field(default=1, ge=1, examples=[1])
    max_name_length: int = Field(default=128, ge=1, le=255, examples=[128])
    select: str | None = Field(default=None, examples=["{id: id, ts: ts}"])
    partition_by: PartitionBy = Field(default_factory=list, examples=[["day(ts)"]])
    properties: dict[str, str] = Field(default_factory=dict)
    evolution: Evolution = Field(default_factory=EvolutionSettings.all_on, examples=[True])
    conversion: ConversionSettings = Field(default_factory=ConversionSettings)
    changes: ChangeSettings | None = Field(default=None, examples=[{"format": "debezium"}])
    """Every dynamically named table is a change table (``key`` unset: from the message keys)."""

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        checked = _check_jmespath(value, "\"join('.', ['raw', topic])\"")
        assert checked is not None
        return checked

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        return _check_jmespath(value, '"{id: id, ts: ts}"')

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc}); e.g. '^raw\\.[a-z0-9_]+$'") from None
        return value

    def table_settings(self) -> TableSettings:
        """Settings that every dynamically named table gets."""
        return TableSettings(
            select=self.select,
            partition_by=self.partition_by,
            properties=self.properties,
            auto_create=self.auto_create,
            evolution=self.evolution,
            conversion=self.conversion,
            changes=self.changes,
        )


class DeadLetterSettings(_ReplicatedTopic):
    """``dead-letter:`` where records that cannot be delivered go (retention: the broker's default)."""

    topic: str = Field(examples=["shop-events-dlq"])
    connect_headers: bool = Field(default=False, examples=[True])
    """Also write Kafka Connect's ``__connect.errors.*`` headers (Connect's
    ``errors.deadletterqueue.context.headers.enable``), so existing DLQ tooling reads ours."""

    def topic_settings(self) -> TopicSettings:
        return TopicSettings(
            section="dead-letter",
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )


class ErrorSettings(_Section):
    """``errors.tolerance``: ``all`` dead-letters a bad record, ``none`` stops the sink.

    Unset, it is ``all`` when a ``dead-letter`` topic is configured and ``none`` otherwise.
    """

    tolerance: Literal["none", "all"] | None = Field(default=None, examples=["all"])


class SparkSettings(_Section):
    """``spark:`` read by the Spark app."""

    master: str = Field(default="local[*]", examples=["local[*]"])
    trigger_interval: Duration = Field(default=timedelta(seconds=10), examples=["10s"])
    available_now: bool = Field(default=False, examples=[True])
    """Spark's ``Trigger.AvailableNow``: deliver what the topics hold at start, commit, exit 0 (as
    ``run --available-now``). For runs a scheduler starts (cron, Airflow) and for ``spark-submit``,
    whose command line is Spark's, not the app's."""
    max_offsets_per_trigger: int | None = Field(default=None, ge=1, examples=[100000])
    max_records_per_batch: int = Field(default=50_000, ge=1_000, le=10_000_000, examples=[50000])
    """Records a task reads, decodes, routes and converts at once (named after Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``): a Python worker's memory holds one such chunk's
    working set, whatever ``max-offsets-per-trigger`` is; append tables' files still roll at their
    target size across chunks."""
    partition_groups: int | None = Field(default=None, ge=1, le=100_000, examples=[8])
    """Groups the source partitions are packed into: a batch runs one Spark task per group that has
    data, delivering all its partitions' ranges in one Kafka transaction. Unset: the executors' cores
    as the app sees them at start (``spark.default.parallelism``, the cores of a ``local[N]`` master,
    or ``spark.executor.instances`` x ``spark.executor.cores``). A partition keeps its group while the
    count stays; a restart with another count fences the old groups' transactional ids first."""
    checkpoint_location: str | None = Field(default=None, examples=["/var/lib/fanout-sink/checkpoints"])
    conf: dict[str, str] = Field(
        default_factory=dict,
        examples=[{"spark.driver.memory": "1g", "spark.executorEnv.MALLOC_ARENA_MAX": "4"}],
    )
    """Spark properties for the app's session, under Spark's own names; they override the sink's
    memory defaults (``spark.driver.memory`` 512m, the serial collector in
    ``spark.driver.extraJavaOptions``, the workers' allocators in ``spark.executorEnv.*``: see
    ``fanout_sink/spark/footprint.py``), and ``--conf`` of ``fanout-sink run`` overrides them."""


class MetricsSettings(_Section):
    """``metrics:`` the driver's Prometheus endpoint (``/metrics``); present = on.

    Absent means off, so the embedded default and several sinks on one machine never fight over a
    port; a production config sets it (``metrics: {}`` serves on 127.0.0.1:9464, the port
    OpenTelemetry reserved for Prometheus exporters; ``host: 0.0.0.0`` for a scraper elsewhere,
    ``port: 0`` for any free port, logged).
    """

    host: str = Field(default="127.0.0.1", examples=["0.0.0.0"])
    port: int = Field(default=9464, ge=0, le=65535, examples=[9464])


class LoggingSettings(_Section):
    """``logging:`` the sink's log on stderr, on the driver and the executors alike (``--log-format``
    and ``--log-level`` of ``fanout-sink run`` override it): ``plain`` text or ``json`` lines."""

    format: LogFormat = Field(default="plain", examples=["json"])
    level: LogLevel = Field(default="INFO", examples=["INFO"])


class SinkConfig(_Section):
    """The whole ``sink.yaml``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", examples=["shop-events"])
    kafka: dict[str, str] = Field(default_factory=dict, examples=[{"bootstrap.servers": "127.0.0.1:9092"}])
    source: SourceSettings
    control: ControlSettings = Field(default_factory=ControlSettings)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    tables: dict[str, TableSettings] = Field(default_factory=dict)
    unmatched: UnmatchedSettings = Field(default_factory=UnmatchedSettings)
    dynamic: DynamicSettings | None = None
    dead_letter: DeadLetterSettings | None = None
    errors: ErrorSettings = Field(default_factory=ErrorSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    metrics: MetricsSettings | None = Field(default=None, examples=[{"port": 9464}])
    maintenance: MaintenanceSettings = Field(
        default_factory=MaintenanceSettings, examples=[{"interval": "1h"}]
    )
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    base_dir: Path = Field(default=Path("."), exclude=True)
    """Folder of the YAML file; relative schema paths resolve against it."""

    @field_validator("kafka", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value

    @field_validator("kafka")
    @classmethod
    def _translatable(cls, value: dict[str, str]) -> dict[str, str]:
        """The same properties must also configure Spark's Java Kafka client: check that they can."""
        sasl_jaas_config(value)
        return value

    @field_validator("tables", mode="before")
    @classmethod
    def _table_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key, settings in value.items():
                check_table_identifier(str(key))
                if settings is None:
                    value[key] = {}
        return value

    @model_validator(mode="after")
    def _check(self) -> SinkConfig:
        if self.control.topic is None:
            object.__setattr__(
                self, "control", self.control.model_copy(update={"topic": f"{self.name}-control"})
            )
        if self.errors.tolerance is None:
            tolerance: Literal["none", "all"] = "all" if self.dead_letter is not None else "none"
            object.__setattr__(self, "errors", ErrorSettings(tolerance=tolerance))
        needs_dlq = {
            "errors.tolerance": self.errors.tolerance == "all",
            "unmatched.action": self.unmatched.action == "dead-letter",
            "source.tombstones": self.source.tombstones == "dead-letter",
        }
        for key, needed in needs_dlq.items():
            if needed and self.dead_letter is None:
                raise ValueError(
                    f"@{key}: sends records to the dead-letter topic, but dead-letter.topic is not set; "
                    "e.g. dead-letter: {topic: shop-events-dlq}"
                )
        changing = [name for name, table in self.tables.items() if table.changes is not None]
        if self.dynamic is not None and self.dynamic.changes is not None:
            changing.append("dynamic")
        if changing and self.source.tombstones == "dead-letter":
            raise ValueError(
                f"@source.tombstones: dead-letter, but {changing[0]} has changes: Debezium and compacted "
                "upsert topics follow every delete with a tombstone (a null value), which belongs to no "
                "route; set source.tombstones: skip (they are counted as filtered)"
            )
        if self.unmatched.action == "table":
            table = self.unmatched.table
            if table not in self.tables:
                raise ValueError(
                    f"@unmatched.table: {table!r} is not declared under tables; "
                    f"add it, e.g. tables: {{{table}: {{}}}}"
                )
            if self.tables[table].when is not None:
                raise ValueError(
                    f"@unmatched.table: {table!r} receives the unmatched records; remove its when: expression"
                )
        if not self.tables and self.dynamic is None:
            raise ValueError(
                "@tables: nothing to route to: declare tables or dynamic; "
                "e.g. tables: {analytics.orders: {when: \"type == 'order'\"}}"
            )
        return self

    @property
    def control_topic(self) -> str:
        """The control topic's name (``control.topic``, defaulted to ``<name>-control`` on load)."""
        assert self.control.topic is not None, "set by the model validator"
        return self.control.topic

    @property
    def checkpoint_location(self) -> str:
        """Spark's checkpoint of this sink: ``spark.checkpoint-location`` (or ``.fanout-sink/checkpoints``
        beside the YAML file), one folder per sink name. A URI (``s3a://bucket/path``,
        ``hdfs://nn/path``, ``file:///path``) keeps its scheme and authority: it is joined as text,
        never as a local path."""
        base = self.spark.checkpoint_location or str(self.base_dir / ".fanout-sink" / "checkpoints")
        if "://" in base:
            return f"{base.rstrip('/')}/{self.name}"
        return str(Path(base) / self.name)

    def maintenance_for(self, table: str) -> MaintenanceSettings:
        """``maintenance:`` with ``tables.<table>.maintenance:`` over it (dynamic tables: the top level)."""
        declared = self.tables.get(table)
        return self.maintenance.overridden_by(declared.maintenance if declared is not None else None)

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the YAML file's folder."""
        candidate = Path(path)
        return candidate if candidate.is_absolute() else self.base_dir / candidate

    def redacted(self) -> dict[str, Any]:
        """The config as plain data with every secret replaced by ``***``."""
        data: dict[str, Any] = redact(self.model_dump(mode="json", by_alias=False))
        return data

    def __repr__(self) -> str:
        return f"SinkConfig({self.redacted()!r})"

    def __str__(self) -> str:
        return repr(self)
