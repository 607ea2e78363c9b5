"""The config's shared value types and the base of every section: durations (``30s``), partition
terms (``day(ts)``), table identifiers, jmespath expressions checked on load, and kebab-case keys
with unknown ones refused (:class:`Section`)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

import jmespath
from pydantic import AliasGenerator, BaseModel, BeforeValidator, ConfigDict

from fanout_sink.config.jmespath_functions import call_problem

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

IDENTIFIER_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""One part of a table identifier, or a top-level column name."""


def string_map(value: Any) -> Any:
    """A YAML mapping of client or table properties as the string map both Kafka and Iceberg take:
    keys and values as strings, booleans spelled ``true``/``false`` as they expect."""
    if isinstance(value, dict):
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    return value


def check_jmespath(value: str | None, example: str) -> str | None:
    """``value`` when it compiles as jmespath and calls only functions the sink has, each with its
    number of arguments (:func:`~fanout_sink.config.jmespath_functions.call_problem`); otherwise an
    error with ``example``."""
    if value is None:
        return None
    try:
        parsed = jmespath.compile(value).parsed
    except jmespath.exceptions.JMESPathError as exc:
        detail = str(exc).splitlines()[0]
        raise ValueError(f"not a valid jmespath expression {value!r} ({detail}); e.g. {example}") from None
    problem = call_problem(dict(parsed))
    if problem is not None:
        fix = "" if "use one of" in problem else f"; e.g. {example}"
        raise ValueError(f"{value!r}: {problem}{fix}")
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
    if len(parts) < 2 or not all(IDENTIFIER_PART.match(p) for p in parts):
        raise ValueError(
            f"not a table identifier {value!r}; write <namespace>.<table> with letters, digits and _, "
            'e.g. "analytics.orders"'
        )
    return value


class Section(BaseModel):
    """YAML keys are kebab-case; unknown keys are errors (they are usually typos)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=AliasGenerator(validation_alias=lambda name: name.replace("_", "-")),
    )
