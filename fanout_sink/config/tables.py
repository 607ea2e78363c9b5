"""Routes and tables: ``tables:`` (each table, its route, partitioning, schema, evolution,
conversion and changes), ``unmatched:`` and ``dynamic:`` (table names computed per record)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from fanout_sink.config.fields import (
    IDENTIFIER_PART,
    Duration,
    PartitionBy,
    Section,
    check_jmespath,
    check_table_identifier,
    string_map,
)
from fanout_sink.config.maintenance import MaintenanceSettings


def _positive_interval(value: timedelta | None) -> timedelta | None:
    if value is not None and value <= timedelta(0):
        raise ValueError(f"must be positive, not {value.total_seconds():g}s; e.g. 10m")
    return value


class EvolutionSettings(Section):
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


class ConversionSettings(Section):
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


class ChangeSettings(Section):
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
            if not IDENTIFIER_PART.match(name):
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
        return check_jmespath(value, "\"status == 'closed'\"")

    @model_validator(mode="after")
    def _check(self) -> ChangeSettings:
        if self.format == "debezium" and self.delete_when is not None:
            raise ValueError(
                "delete-when is only for format upsert: Debezium events say deletes themselves (op d); "
                "remove delete-when"
            )
        return self


class TableSettings(Section):
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
    commit_interval: Duration | None = Field(default=None, examples=["10m"])
    """The table's own commit cadence: its files wait on the control topic and are committed in the
    first round of each period of this length (``protocol/table_cadence.py``), small ones merged into
    files of the table's ``write.target-file-size-bytes``. Unset: the table commits in every round."""

    @field_validator("commit_interval")
    @classmethod
    def _commit_interval(cls, value: timedelta | None) -> timedelta | None:
        return _positive_interval(value)

    @field_validator("when")
    @classmethod
    def _when(cls, value: str | None) -> str | None:
        return check_jmespath(value, "\"type == 'order'\"")

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        return check_jmespath(value, '"{id: id, customer: customer.id}"')

    @field_validator("properties", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return string_map(value)


class UnmatchedSettings(Section):
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


class DynamicSettings(Section):
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
    commit_interval: Duration | None = Field(default=None, examples=["10m"])
    """Every dynamically named table's own commit cadence (as a declared table's ``commit-interval``)."""

    @field_validator("commit_interval")
    @classmethod
    def _commit_interval(cls, value: timedelta | None) -> timedelta | None:
        return _positive_interval(value)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        checked = check_jmespath(value, "\"join('.', ['raw', topic])\"")
        assert checked is not None
        return checked

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        return check_jmespath(value, '"{id: id, ts: ts}"')

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
            commit_interval=self.commit_interval,
        )
