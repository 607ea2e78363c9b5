"""The sink's YAML configuration as typed, validated pydantic models (:class:`SinkConfig`).

Key names follow the YAML (``commit-interval``, ``dead-letter``); Python attributes use snake case.
Sections ``kafka``, ``catalog`` and ``source.schema-registry`` pass their keys through unchanged
(librdkafka, PyIceberg and Schema Registry client property names). Secrets in them are named by
:func:`~fanout_sink.config.secrets.is_secret_key`; :meth:`SinkConfig.redacted` and ``repr``/``str``
of a config hide them. Reading a YAML file into these models is
:mod:`~fanout_sink.config.loading`'s job.

Each section is a model of its own module (``source``, ``topics``, ``tables``, ``maintenance``,
``runtime``; shared value types in ``fields``), imported from there by the code that needs
that section; this module holds the whole file and the checks across sections.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fanout_sink.catalog import CatalogSettings, sqlite_uri_under
from fanout_sink.config.fields import Section, check_table_identifier, string_map
from fanout_sink.config.maintenance import MaintenanceSettings
from fanout_sink.config.runtime import LoggingSettings, MetricsSettings, SparkSettings
from fanout_sink.config.secrets import redact
from fanout_sink.config.source import SourceSettings
from fanout_sink.config.tables import DynamicSettings, TableSettings, UnmatchedSettings
from fanout_sink.config.topics import ControlSettings, DeadLetterSettings, ErrorSettings
from fanout_sink.kafka.java_client import sasl_jaas_config


class SinkConfig(Section):
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

    @model_validator(mode="before")
    @classmethod
    def _relative_to_the_yaml(cls, data: Any) -> Any:
        """A relative SQLite path in ``catalog.uri`` is relative to the YAML's folder, as ``schema:``
        paths are: the same file whichever folder a command runs from. (A catalog taken from
        ``.pyiceberg.yaml`` keeps PyIceberg's own meaning: only the YAML's ``uri`` is resolved.)"""
        if not isinstance(data, dict) or "base_dir" not in data:
            return data
        catalog = data.get("catalog")
        if isinstance(catalog, dict) and isinstance(catalog.get("uri"), str):
            uri = sqlite_uri_under(catalog["uri"], Path(data["base_dir"]))
            data = {**data, "catalog": {**catalog, "uri": uri}}
        return data

    @field_validator("kafka", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return string_map(value)

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
        self._check_commit_intervals()
        if not self.tables and self.dynamic is None:
            raise ValueError(
                "@tables: nothing to route to: declare tables or dynamic; "
                "e.g. tables: {analytics.orders: {when: \"type == 'order'\"}}"
            )
        return self

    def _check_commit_intervals(self) -> None:
        """A table's own ``commit-interval`` lies between the round cadence and what the control
        topic keeps: its files wait there until it commits."""
        routes = [(f'tables."{name}"', t.commit_interval) for name, t in self.tables.items()]
        if self.dynamic is not None:
            routes.append(("dynamic", self.dynamic.commit_interval))
        control = self.control
        for where, interval in routes:
            if interval is None:
                continue
            if interval < control.commit_interval:
                raise ValueError(
                    f"@{where}.commit-interval: {interval.total_seconds():g}s is shorter than "
                    f"control.commit-interval ({control.commit_interval.total_seconds():g}s): a table "
                    "commits at most once a round; lower control.commit-interval to it and give the "
                    "colder tables a longer commit-interval"
                )
            if control.retention_ms >= 0 and interval.total_seconds() * 1000 > control.retention_ms / 2:
                raise ValueError(
                    f"@{where}.commit-interval: {interval.total_seconds():g}s is more than half of "
                    f"control.retention-ms ({control.retention_ms}): the table's files wait on the "
                    "control topic until it commits, and a restart after a crash must still find them; "
                    "shorten the interval or raise control.retention-ms to at least twice it"
                )

    def commit_interval_for(self, table: str) -> timedelta | None:
        """The table's own ``commit-interval`` (a declared table's, else ``dynamic``'s); None: the
        table commits in every round."""
        declared = self.tables.get(table)
        if declared is not None:
            return declared.commit_interval
        return self.dynamic.commit_interval if self.dynamic is not None else None

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
        never as a local path; a relative path is relative to the YAML's folder, as every path in it."""
        base = self.spark.checkpoint_location or str(self.base_dir / ".fanout-sink" / "checkpoints")
        if "://" in base:
            return f"{base.rstrip('/')}/{self.name}"
        return str(self.resolve(base) / self.name)

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
