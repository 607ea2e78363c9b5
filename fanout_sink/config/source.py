"""``source:``: the topics the sink reads and how their values are encoded."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fanout_sink.config.fields import Duration, Section


class SourceSettings(Section):
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
