"""Reading a sink's YAML file into a :class:`~fanout_sink.config.models.SinkConfig`.

``load_config(path)`` reads a YAML file, substitutes ``${ENV_VAR}`` (and ``${ENV_VAR:-default}``)
references in string values, and validates the result. Anything wrong raises
:class:`~fanout_sink.errors.ConfigError` before the sink starts, naming the YAML path, the problem
and an example of a valid value (rendered from pydantic's errors and the models' ``examples``), e.g.::

    sink.yaml: tables."analytics.orders".partition-by[0]: unknown transform 'dayz(ts)'; use one of
    identity, bucket[N], truncate[W], year, month, day, hour, e.g. "day(ts)"
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fanout_sink.catalog import sqlite_uri_under
from fanout_sink.config.models import SinkConfig
from fanout_sink.config.tables import TableSettings
from fanout_sink.errors import ConfigError, FanoutSinkError
from fanout_sink.kafka.java_client import PropertyError, java_tls_properties

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute_env(node: Any, path: str, source: str, only: Collection[str] | None = None) -> Any:
    """``node`` with its ``${VAR}`` references replaced (only those to ``only``'s names if given)."""
    if isinstance(node, dict):
        return {k: _substitute_env(v, _join(path, k), source, only) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute_env(v, f"{path}[{i}]", source, only) for i, v in enumerate(node)]
    if isinstance(node, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if only is not None and name not in only:
                return match.group(0)
            value = os.environ.get(name, default)
            if value is None:
                raise ConfigError(
                    source,
                    path,
                    f"environment variable {name} is not set",
                    f"export {name}=... before starting, or write ${{{name}:-default}}",
                )
            return value

        return _ENV_REF.sub(replace, node)
    return node


def _join(path: str, key: Any) -> str:
    text = str(key)
    part = f'"{text}"' if not re.match(r"^[A-Za-z0-9_-]+$", text) else text
    return f"{path}.{part}" if path else part


def _location(loc: tuple[int | str, ...]) -> str:
    path = ""
    for item in loc:
        path = f"{path}[{item}]" if isinstance(item, int) else _join(path, item)
    return path


def _example_for(loc: tuple[int | str, ...]) -> Any:
    """The ``examples`` of the model field at ``loc``, walking the model classes."""
    model: Any = SinkConfig
    example: Any = None
    for item in loc:
        if isinstance(item, int) or model is None:
            continue
        fields = getattr(model, "model_fields", None)
        if not fields:
            model = None
            continue
        found = None
        for name, info in fields.items():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else None
            if item in {name, alias, name.replace("_", "-")}:
                found = info
                break
        if found is None:
            if model is SinkConfig.model_fields["tables"].annotation or str(item).count("."):
                model = TableSettings
            continue
        example = found.examples[0] if found.examples else None
        annotation = found.annotation
        model = _model_in(annotation)
        if item == "tables":
            model = TableSettings
    return example


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _format_example(example: Any) -> str:
    if isinstance(example, str):
        return f'"{example}"'
    return yaml.safe_dump(example, default_flow_style=True).strip()


def _errors(exc: ValidationError, source: str) -> ConfigError:
    problems: list[tuple[str, str, str]] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        # Drop pydantic's union/function tags from the location.
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
        message = error["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if message.startswith("Assertion failed, "):
            message = message[len("Assertion failed, ") :]
        if error["type"] == "extra_forbidden":
            message = f"unknown key {loc[-1]!r} (a typo?)"
        fix = ""
        if "e.g." not in message and "use one of" not in message:
            example = _example_for(loc)
            if error["type"] == "extra_forbidden":
                fix = "remove it or check its spelling against the documented keys"
            elif example is not None:
                fix = f"e.g. {_format_example(example)}"
        where = _location(loc) or "(top level)"
        if message.startswith("@") and ": " in message:  # a model-level check naming its own key
            where, message = message[1:].split(": ", 1)
        problems.append((where, message, fix))
    return ConfigError.many(source, problems)


def _check_schema_files(config: SinkConfig, source: str) -> None:
    """Schema files named by the config exist and are usable Avro record schemas."""
    from fanout_sink.avro_schema import avro_to_arrow_schema, load_avro_schema

    named: list[tuple[str, str | None]] = [("source.schema", config.source.schema_file)]
    named += [(f'tables."{name}".schema', t.schema_file) for name, t in config.tables.items()]
    problems: list[tuple[str, str, str]] = []
    for path_in_yaml, file in named:
        if not file:
            continue
        resolved = config.resolve(file)
        if not resolved.is_file():
            problems.append(
                (path_in_yaml, f"schema file {resolved} not found", "give a path relative to the YAML file")
            )
            continue
        try:
            avro_to_arrow_schema(load_avro_schema(resolved))
        except FanoutSinkError as exc:
            problems.append((path_in_yaml, str(exc), 'e.g. {"type": "record", "name": "R", "fields": [...]}'))
    if problems:
        raise ConfigError.many(source, problems)


def _check_kafka_tls(config: SinkConfig, source: str) -> None:
    """The TLS files under ``kafka:`` are readable and serve Spark's Java Kafka client as well as
    librdkafka (a wrong password or a missing file would otherwise stop the app after Spark started)."""
    try:
        java_tls_properties(config.kafka)
    except PropertyError as exc:
        raise ConfigError(source, _join("kafka", exc.key), exc.problem, exc.fix) from None


def key_value(item: str) -> tuple[str, str]:
    """A command line's ``KEY=VALUE`` setting, as an argparse type (argparse names the option)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {item!r}")
    return key.strip(), value


def parse_config(data: Any, source: str = "<config>", base_dir: Path | None = None) -> SinkConfig:
    """Validate already-parsed YAML data (a mapping) into a :class:`SinkConfig`."""
    if not isinstance(data, dict):
        raise ConfigError(source, "(top level)", "the file is not a YAML mapping", "start with name: my-sink")
    data = _substitute_env(data, "", source)
    if base_dir is not None:
        data = {**data, "base_dir": base_dir}
    try:
        config = SinkConfig.model_validate(data)
    except ValidationError as exc:
        raise _errors(exc, source) from None
    _check_schema_files(config, source)
    _check_kafka_tls(config, source)
    return config


def load_config(path: str | Path) -> SinkConfig:
    """Read, substitute and validate a sink YAML file; raise :class:`ConfigError` on any problem."""
    path = Path(path)
    return parse_config(_read_yaml(path), path.name, base_dir=path.resolve().parent)


def write_standalone_copy(path: str | Path, target: Path, variables: Collection[str]) -> Path:
    """A copy of the YAML file at ``target`` that works from any folder and without ``variables``
    set: their ``${VAR}`` references take this process's values (others stay references, so no
    secret from the environment lands in the file) and relative schema and SQLite catalog paths
    become absolute.

    The demo leaves one beside its tables, so the ``status`` and ``sql`` commands it prints find them.
    Comments are not kept (the file is written from the parsed YAML).
    """
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(
            path.name, "(top level)", "the file is not a YAML mapping", "start with name: my-sink"
        )
    data = _substitute_env(data, "", path.name, only=frozenset(variables))
    base = path.resolve().parent
    sections = [data.get("source"), *(data.get("tables") or {}).values()]
    for section in sections:
        if isinstance(section, dict) and isinstance(section.get("schema"), str):
            section["schema"] = str((base / section["schema"]).resolve())  # an absolute one stays
    catalog = data.get("catalog")
    if isinstance(catalog, dict) and isinstance(catalog.get("uri"), str) and "${" not in catalog["uri"]:
        catalog["uri"] = sqlite_uri_under(catalog["uri"], base)  # a relative SQLite path, as schema paths
    target.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return target


def _read_yaml(path: Path) -> Any:
    """The parsed YAML file; :class:`ConfigError` naming the file or the line when it cannot be."""
    source = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            source, "(file)", f"cannot read {path}: {exc.strerror}", "pass --config <sink.yaml>"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            source, where, f"not valid YAML: {problem}", "check indentation and quoting"
        ) from None
    return data
