"""``fanout-sink validate``: what ``run`` would stop on, found before deploying, with nothing created.

It runs the start-up checks of :mod:`fanout_sink.preflight` (config, broker, credentials, source
topics or pattern, control and dead-letter topics, warehouse, catalog) in ``dry_run`` mode and
reports every finding instead of stopping at the first. Then it checks each declared table against
its route, as far as the config tells the types:

- a table that does not exist with ``auto-create: false``: a problem;
- the columns the route gives (its ``select``, else the records' fields when ``source.schema``
  declares them; a table to be created from its ``schema`` file is checked against that file):
  a ``select`` column the table lacks while ``evolution.add-columns`` is off (its values would be
  dropped), a required column the route never fills (unless ``evolution.make-optional``), a column
  whose type no value of the route's type can be converted to: problems, since every record would
  be dropped, dead-lettered or stop the sink. The converter itself decides convertibility
  (:func:`~fanout_sink.transform.convert.type_mismatches` runs it on placeholder values); JSON
  fields have no type before records arrive, so only their names are checked;
- ``partition-by`` differing from an existing table's spec: a warning (the sink writes with the
  table's own spec and never changes it);
- a change table's ``changes.key``: an existing table's identifier fields must be it, a table to
  be created must have the key columns (top-level, primitive, not floating point) in its schema
  file or among its ``select``'s columns: problems, as ``run`` stops on them;
- dynamic routes: the name ``dynamic.table`` gives each source topic's records when it reads only
  Kafka metadata (a rejected name is a warning; names read from record fields are checked per record).

Nothing is created (no topic, catalog file or table, no folder) and no Spark starts.

``--offline`` checks what needs no server: the config and each declared table against its route as if
no table existed yet (auto-create's schema file, partition and key columns, the dynamic name). It is
what a build can run where the broker and the catalog are not reachable, e.g. the docker image's build.
Its lines say what it cannot know: a table is "not looked up offline" (never "does not exist"),
and the verdict names what was not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jmespath
import numpy as np
import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError

from fanout_sink.avro_schema import avro_to_arrow_schema, load_avro_schema
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.config.tables import TableSettings
from fanout_sink.errors import ConfigError, PreflightError, TableError
from fanout_sink.kafka.range_reader import RAW_RECORD_SCHEMA
from fanout_sink.preflight import BROKER_TIMEOUT_S, CHECKS, Finding, Preflight
from fanout_sink.transform.convert import Matching, placeholder_rows, type_mismatches
from fanout_sink.transform.expressions import NameExpression, Projection
from fanout_sink.transform.formats.decoded import Decoded
from fanout_sink.transform.record_view import META_FIELDS, RecordView
from fanout_sink.transform.routing import NameRules, normalise_table_name
from fanout_sink.transform.tables import TableKey, check_key, iceberg_schema


@dataclass(frozen=True)
class Report:
    """Every finding, in the order the checks ran."""

    findings: list[Finding]
    offline: bool = False
    """Nothing was contacted: the verdict covers the config and the routes only."""

    @property
    def ok(self) -> bool:
        return not any(f.level == "problem" for f in self.findings)

    def lines(self) -> tuple[list[str], list[str]]:
        """(stdout, stderr): the summary when nothing is wrong, else only problems and warnings."""
        out: list[str] = []
        err: list[str] = []
        for finding in self.findings:
            if finding.level == "ok":
                if self.ok:
                    out.append(f"ok  {finding.text}")
                continue
            label = "" if finding.level == "problem" else "warning: "
            err += [f"fanout-sink: {label}{finding.text}", f"  fix: {finding.fix}"]
        if self.ok:
            warnings = sum(f.level == "warning" for f in self.findings)
            out.append(
                "valid offline: nothing in the config or the routes stops this sink; the broker, the "
                "catalog and its tables were not checked (validate without --offline where they are "
                "reachable)"
                if self.offline
                else f"valid: nothing stops this sink from starting ({warnings} warning(s))"
            )
        return out, err

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [{"level": f.level, "text": f.text, "fix": f.fix} for f in self.findings],
        }


def validate(path: Path, broker_timeout_s: float = BROKER_TIMEOUT_S, offline: bool = False) -> Report:
    """Every check on the config at ``path``; creates nothing, starts no Spark. ``offline``: contacts
    nothing (no broker, catalog or warehouse) and checks the tables as if none existed yet."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return Report([_config_finding(exc.source, *problem) for problem in exc.problems])
    findings = [Finding("ok", f"config {path.name}: valid ({len(config.tables)} declared table(s))")]
    if offline:
        contacted = "offline: the broker, topics, warehouse and catalog were not contacted"
        findings.append(Finding("ok", contacted))
        return Report(findings + check_tables(config, None, offline=True), offline=True)
    pre = Preflight(config, broker_timeout_s, dry_run=True)
    for _, check in CHECKS:
        try:
            found = list(check(pre))
        except PreflightError as exc:
            found = [Finding.of(exc)]
        findings += [f for f in found if f not in findings]  # a broker failure is reported once
    catalog_failed = any(f.level == "problem" and f.text.startswith("catalog ") for f in findings)
    if not catalog_failed:
        findings += check_tables(config, pre.catalog)
    return Report(findings)


def _config_finding(source: str, path: str, problem: str, fix: str) -> Finding:
    """A :class:`ConfigError` problem as cause + fix; a problem that carries its example ("...; e.g.
    x") is split there."""
    if not fix:
        cause, sep, example = problem.rpartition("; ")
        problem, fix = (cause, example) if sep else (problem, f"correct {path} in {source}")
    return Finding("problem", f"{source}: {path}: {problem}", fix)


# --------------------------------------------------------------------------------------------
# Tables


def check_tables(config: SinkConfig, catalog: Any, offline: bool = False) -> list[Finding]:
    """Each declared table against its route; the dynamic name template. ``catalog`` None: the
    catalog does not exist yet, so neither does any table; with ``offline``, whether one does is
    unknown (``auto-create: false`` is then not a problem)."""
    findings: list[Finding] = []
    source = _source_schema(config)
    for name, settings in config.tables.items():
        findings += _check_table(config, catalog, source, name, settings, offline)
    if config.dynamic is not None:
        findings += _check_dynamic(config)
    return findings


def _source_schema(config: SinkConfig) -> pa.Schema | None:
    """The records' Arrow schema when the config declares it (``format: avro``); else None: JSON has
    no types before records arrive, and a registry's schema comes with each record."""
    if config.source.format == "avro" and config.source.schema_file:
        return avro_to_arrow_schema(load_avro_schema(config.resolve(config.source.schema_file)))
    return None


def _probe(source: pa.Schema | None, topic: str | None = None) -> RecordView:
    """A one-record view standing for every record: placeholder values of the declared schema (no
    fields when undeclared: a projection then gives untyped, null columns), Kafka metadata."""
    records = placeholder_rows(source) if source is not None else pa.table({})
    python: list[Any] | None = None if source is not None else [{}]
    decoded = Decoded(records, np.zeros(1, dtype=np.int64), _python_cache=python)
    raw = pa.Table.from_pylist(
        [{"topic": topic, "partition": 0, "offset": 0, "timestamp": datetime.fromtimestamp(0, UTC)}],
        schema=RAW_RECORD_SCHEMA,
    )
    return RecordView.build(decoded, raw)


def _route_rows(settings: TableSettings, source: pa.Schema | None) -> tuple[pa.Table, bool] | None:
    """The route's row for the probe record and whether its columns are all known (a ``select``
    object names them all; without one, only a declared source schema does); None: unknown."""
    view = _probe(source)
    if settings.select is None:
        return (view.records, True) if source is not None else None
    rows, _, failures = Projection(settings.select).apply(view, np.arange(1))
    if failures:
        return None
    complete = source is not None or jmespath.compile(settings.select).parsed["type"] == "multi_select_dict"
    # A select jmespath evaluates per record may compute real values from the placeholders (the text
    # "null" from to_string(null)): only the types it gives stand for every record.
    return placeholder_rows(rows.schema), complete


def _check_table(
    config: SinkConfig,
    catalog: Any,
    source: pa.Schema | None,
    name: str,
    settings: TableSettings,
    offline: bool = False,
) -> list[Finding]:
    key = f'tables."{name}"'
    table = None
    if catalog is not None:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            pass
        except Exception as exc:  # the catalog's own errors (HTTP, SQL, metadata files)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return [
                Finding(
                    "problem",
                    f"{key}: table {name} cannot be loaded from catalog {config.catalog.name!r}: "
                    f"{type(exc).__name__}: {first}",
                    "check the sink's rights on the table in the catalog, and that its metadata files exist",
                )
            ]
    findings: list[Finding] = []
    # Offline, a missing table is not known to be missing: the checks below assume it is, to check
    # what run would create, and the lines say so without claiming it.
    unknown = "not looked up offline; if it does not exist, run creates it from"
    if table is None:
        if not settings.auto_create and offline:
            return [Finding("ok", f"table {name}: not looked up offline; run needs it to exist")]
        if not settings.auto_create:
            where = f"catalog {config.catalog.name!r}"
            return [
                Finding(
                    "problem",
                    f"{key}: table {name} does not exist in {where} and {key}.auto-create is false",
                    f"create table {name} first, or set {key}.auto-create: true",
                )
            ]
        if settings.schema_file is None:
            route = _route_rows(settings, source)
            if route is not None and route[1]:
                findings += _check_partition_columns(key, "the route", route[0].column_names, settings)
                findings += _check_key_columns(key, "the route", route[0].column_names, settings)
            created = (
                f"{unknown} its first rows" if offline else "does not exist yet; created from its first rows"
            )
            return findings or [Finding("ok", f"table {name}: {created}")]
        target = avro_to_arrow_schema(load_avro_schema(config.resolve(settings.schema_file)))
        what = f"{key}.schema"
        findings += _check_partition_columns(key, what, target.names, settings)
        findings += _check_key(config, name, target, None, settings)
        created = unknown if offline else "does not exist yet; created from"
        findings.append(Finding("ok", f"table {name}: {created} {settings.schema_file}"))
    else:
        target = table.schema().as_arrow()
        what = f"table {name}"
        findings += _check_partitions(key, name, table, settings)
        findings += _check_key(config, name, None, table, settings)
    route = _route_rows(settings, source)
    if route is None:
        findings.append(Finding("ok", f"table {name}: the route's columns are known only from records"))
        return findings
    rows, complete = route
    found = _check_columns(key, what, rows, complete, target, settings)
    typed = sum(not pa.types.is_null(t) for t in rows.schema.types)
    fit = f"table {name}: the route's {rows.num_columns} column(s) fit {what} ({typed} with a known type)"
    findings += found or [Finding("ok", fit)]
    return findings


def _check_columns(
    key: str, what: str, rows: pa.Table, complete: bool, target: pa.Schema, settings: TableSettings
) -> list[Finding]:
    matching = Matching.of(settings.conversion)
    names = rows.column_names
    sources = {f.name: matching.find(names, f.name, f.name) for f in target}
    findings: list[Finding] = []
    if settings.select is not None and not settings.evolution.add_columns:
        extra = [n for n in names if n not in sources.values()]
        if extra:
            findings.append(
                Finding(
                    "problem",
                    f"{key}.select: gives {_listed(extra)}, which {what} lacks, and "
                    f"{key}.evolution.add-columns is false: those values would be dropped",
                    f"add the column(s) to the table, set {key}.evolution.add-columns: true, or take "
                    "them out of select",
                )
            )
    if complete and not settings.evolution.make_optional:
        unfilled = [f.name for f in target if not f.nullable and sources[f.name] is None]
        if unfilled:
            findings.append(
                Finding(
                    "problem",
                    f"{key}: required {_listed(unfilled)} of {what} never filled by the route: every "
                    "record would fail conversion",
                    f"give it a value in {key}.select or {key}.conversion.name-mapping, make it optional, "
                    f"or set {key}.evolution.make-optional: true",
                )
            )
    for path in type_mismatches(rows, target, matching):
        top = path.split(".")[0].split("[")[0]
        given = rows.schema.field(sources[top]).type if sources.get(top) else "?"
        findings.append(
            Finding(
                "problem",
                f"{key}: column {path!r} is {target.field(top).type} in {what}, but the route gives it "
                f"{given} values, which never convert to that: every record would fail conversion",
                f"map a field of a convertible type to {top!r} in {key}.select, or change the column's type",
            )
        )
    return findings


def _listed(names: list[str]) -> str:
    return f"column{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}"


def _check_partition_columns(
    key: str, what: str, columns: list[str], settings: TableSettings
) -> list[Finding]:
    """A table to be created: each ``partition-by`` column must be one of its columns."""
    return [
        Finding(
            "problem",
            f"{key}.partition-by: {part} names column {part.column!r}, which {what} does not give: "
            "creating the table would fail",
            f"partition by one of {', '.join(columns) or '(no columns)'}, or give {part.column!r} a value",
        )
        for part in settings.partition_by
        if part.column.split(".")[0] not in columns
    ]


def _check_key_columns(key: str, what: str, columns: list[str], settings: TableSettings) -> list[Finding]:
    """A change table to be created from its route: each key column must be one of its columns."""
    wanted = settings.changes.key if settings.changes is not None else None
    missing = [k for k in wanted or [] if k not in columns]
    if not missing:
        return []
    return [
        Finding(
            "problem",
            f"{key}.changes.key: names {_listed(missing)}, which {what} does not give: no change could "
            "be applied",
            f"key by some of {', '.join(columns) or '(no columns)'}, or select the key columns",
        )
    ]


def _check_key(
    config: SinkConfig, name: str, schema: pa.Schema | None, table: Any, settings: TableSettings
) -> list[Finding]:
    """A change table's key against the table (its identifier fields) or the schema it is to be
    created from (key columns present, primitive); the same checks ``run`` makes."""
    if settings.changes is None or settings.changes.key is None:
        return []
    table_key = TableKey.configured(name, config, tuple(settings.changes.key))
    try:
        if table is not None:
            check_key(name, table, table_key)
        elif schema is not None:
            iceberg_schema(name, schema, table_key)
    except TableError as exc:
        problem, _, fix = str(exc).partition("; ")
        return [Finding("problem", f'tables."{name}".changes.key: {problem}', fix)]
    return []


def _check_partitions(key: str, name: str, table: Any, settings: TableSettings) -> list[Finding]:
    if not settings.partition_by:
        return []
    schema = table.schema()
    actual = [
        f"{field.transform}({schema.find_column_name(field.source_id)})"
        for field in table.spec().fields
        if str(field.transform) != "void"
    ]
    wanted = [str(part) for part in settings.partition_by]
    if actual == wanted:
        return []
    return [
        Finding(
            "warning",
            f"{key}.partition-by: is {', '.join(wanted)} but table {name} is partitioned by "
            f"{', '.join(actual) or 'nothing'}; the sink keeps the existing table's spec",
            "make partition-by match the table, or change the table's spec (Spark SQL: ALTER TABLE ... "
            "ADD/DROP PARTITION FIELD)",
        )
    ]


def _check_dynamic(config: SinkConfig) -> list[Finding]:
    dynamic = config.dynamic
    assert dynamic is not None
    expression = NameExpression(dynamic.table)
    if expression.paths is None or any(path[0] not in META_FIELDS for path in expression.paths):
        return [
            Finding("ok", f"dynamic.table {dynamic.table!r} reads record fields: names checked per record")
        ]
    if not config.source.topics:
        return [
            Finding("ok", f"dynamic.table {dynamic.table!r}: source.pattern topics' names checked per record")
        ]
    rules = NameRules(dynamic.allow, dynamic.max_namespace_depth, dynamic.max_name_length)
    findings: list[Finding] = []
    for topic in config.source.topics:
        raw = expression.names(_probe(None, topic), np.arange(1))[0]
        table, reason = normalise_table_name(raw, rules)
        if table is None:
            findings.append(
                Finding(
                    "warning",
                    f"dynamic.table: records of topic {topic!r} get no table: {reason}",
                    "correct dynamic.table, or widen dynamic.allow / dynamic.max-namespace-depth",
                )
            )
        else:
            findings.append(Finding("ok", f"dynamic.table names records of topic {topic!r} {table}"))
    return findings
