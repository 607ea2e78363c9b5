"""The offline half of moving over from the Iceberg Kafka Connect sink: its connector config as a
sink YAML. Contacts nothing.

Both families of the Java sink are read: Apache's ``org.apache.iceberg.connect`` and Tabular's
``io.tabular.iceberg.connect``. Every key :func:`translate` cannot carry is listed with the reason, so
nothing is dropped silently, and the YAML is loaded as `run` loads it before it is returned
(:func:`check`). The connector's groups and control topic are kept in :class:`Imported` for the
takeover (``connect_import/takeover.py``), which the translation itself never reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.connect_import import credentials
from fanout_sink.connect_import.credentials import References, as_references, sqlalchemy_catalog

APACHE_CLASS = "org.apache.iceberg.connect.IcebergSinkConnector"
TABULAR_CLASS = "io.tabular.iceberg.connect.IcebergSinkConnector"
CONNECTOR_CLASSES = (APACHE_CLASS, TABULAR_CLASS)

# Keys Connect itself reads, not the connector: carried where the sink has a meaning for them.
_CONVERTERS = {
    "org.apache.kafka.connect.json.JsonConverter": "json",
    "io.confluent.connect.avro.AvroConverter": "confluent-avro",
    "io.confluent.connect.protobuf.ProtobufConverter": "confluent-protobuf",
    "io.confluent.connect.json.JsonSchemaConverter": "confluent-json-schema",
}
_JAVA_TRANSFORMS = {
    "year": "year", "years": "year", "month": "month", "months": "month",
    "day": "day", "days": "day", "hour": "hour", "hours": "hour", "identity": "identity",
}  # fmt: skip
# Iceberg Java catalog properties PyIceberg names otherwise, or does not need.
_CATALOG_RENAMES = {"client.region": "s3.region"}
_CATALOG_JAVA_ONLY = {
    "catalog-impl": "the catalog type is derived from it (catalog.type)",
    "io-impl": (
        "PyIceberg picks its FileIO from the warehouse's scheme; Spark's is derived (fanout_sink/catalog.py)"
    ),
    "clients": "the size of Iceberg Java's JDBC connection pool; PyIceberg and Spark size their own",
}


ImportError_ = credentials.ImportError_
"""A connector config the sink cannot take, naming the key (raised here and in ``credentials``)."""


@dataclass(frozen=True)
class Uncarried:
    """One connector key the sink YAML does not hold, and why."""

    key: str
    reason: str


@dataclass
class Imported:
    """The sink YAML's data, the keys left out, and what the takeover needs from the connector."""

    sink: dict[str, Any]
    uncarried: list[Uncarried]
    connector: str
    connect_group: str
    control_topic: str
    control_group: str
    commit_group: str
    """The group the connector's worker commits the source offsets to in the transaction that
    announces its files, which its events and its snapshot summaries name: Connect's group for
    Apache's sink; for Tabular's its control group (it commits there first, to Connect's group after,
    and reads it back on start: its source of truth)."""
    variables: dict[str, str] = field(default_factory=dict)
    """The ``${VAR}`` references the YAML holds for the connector's secrets and config-provider
    values, each with the connector key it stands for (``connect_import/credentials.py``)."""

    def yaml(self) -> str:
        header = (
            "# Imported by `fanout-sink import-connect` from the Iceberg Kafka Connect sink "
            f"{self.connector!r}.\n"
            f"# Keys not carried: {len(self.uncarried)} (listed by the command).\n"
        )
        if self.variables:
            names = ", ".join(self.variables)
            header += f"# Set before `fanout-sink run` (secrets are not written here): {names}.\n"
        return header + yaml.safe_dump(self.sink, sort_keys=False, allow_unicode=True)


@dataclass
class _Reader:
    """The connector's properties with every key read marked, so the rest can be reported."""

    refs: References
    used: set[str] = field(default_factory=set)
    uncarried: list[Uncarried] = field(default_factory=list)

    @property
    def props(self) -> dict[str, str]:
        return self.refs.props

    def get(self, key: str, default: str | None = None) -> str | None:
        """A value the import reads (not one it only passes on): never a config-provider reference."""
        if key in self.props:
            self.refs.parsed(key)
            self.used.add(key)
            return self.props[key]
        return default

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if value.strip().lower() not in ("true", "false"):
            raise ImportError_(f"{key}: {value!r} is not a boolean; use true or false")
        return value.strip().lower() == "true"

    def prefixed(self, prefix: str) -> dict[str, str]:
        found = {key[len(prefix) :]: value for key, value in self.props.items() if key.startswith(prefix)}
        self.used.update(prefix + key for key in found)
        return found

    def drop(self, key: str, reason: str) -> None:
        self.used.add(key)
        self.uncarried.append(Uncarried(key, reason))


def load_connector(path: str | Path) -> dict[str, str]:
    """A connector config as Connect takes it: the REST body ``{"name", "config": {...}}``, the bare
    ``config`` object, or a ``.properties`` file (ConnectStandalone's form)."""
    text = Path(path).read_text()
    if Path(path).suffix == ".properties":
        props: dict[str, str] = {}
        for raw in text.splitlines():
            line = raw.strip()
            if line and not line.startswith(("#", "!")) and "=" in line:
                key, _, value = line.partition("=")
                props[key.strip()] = value.strip()
        return props
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportError_(
            f"{path}: not JSON ({exc}); give the connector's config as Connect's REST API takes it"
        ) from exc
    if not isinstance(data, dict):
        raise ImportError_(f'{path}: a JSON object is needed, e.g. {{"name": "events", "config": {{...}}}}')
    config = data.get("config", data)
    props = {str(key): str(value) for key, value in config.items()}
    if "name" in data and "name" not in props:
        props["name"] = str(data["name"])
    return props


def _identifier(path: str) -> str:
    """A Connect field path (dots for nesting, as the Java sink reads the route field) as jmespath."""
    parts = path.split(".")
    return ".".join(p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else json.dumps(p) for p in parts)


def _literal(text: str) -> str:
    return "'" + text.replace("\\'", "'").replace("'", "\\'") + "'"


def _partition_by(key: str, value: str) -> list[str]:
    """Iceberg Java's partition terms (``days(ts)``, ``bucket(id, 16)``) in the sink's spelling."""
    terms = [t.strip() for t in re.split(r",(?![^()]*\))", value) if t.strip()]
    out: list[str] = []
    for term in terms:
        match = re.fullmatch(r"(\w+)\((.+)\)", term)
        if not match:
            out.append(term)
            continue
        transform, args = match.group(1).lower(), [a.strip() for a in match.group(2).split(",")]
        if transform in _JAVA_TRANSFORMS and len(args) == 1:
            out.append(f"{_JAVA_TRANSFORMS[transform]}({args[0]})")
        elif transform in ("bucket", "truncate") and len(args) == 2 and args[1].isdigit():
            out.append(f"{transform}[{args[1]}]({args[0]})")
        else:
            raise ImportError_(
                f"{key}: partition term {term!r} is not one Iceberg's Kafka Connect sink takes"
            )
    return out


def _catalog(reader: _Reader) -> dict[str, Any]:
    """``iceberg.catalog.*`` as the sink's catalog section: Iceberg property names kept, the JDBC
    catalog's URI in SQLAlchemy's form (what PyIceberg's SQL catalog and our Spark derivation take)."""
    props = reader.prefixed("iceberg.catalog.")
    catalog: dict[str, Any] = {"name": reader.get("iceberg.catalog", "iceberg")}
    for key in ("catalog-impl", "type"):
        if key in props:
            reader.refs.parsed(f"iceberg.catalog.{key}")
    impl = props.pop("catalog-impl", None)
    kind = props.pop("type", None)
    if impl:
        short = impl.rsplit(".", 1)[-1]
        kind = {
            "JdbcCatalog": "sql",
            "RESTCatalog": "rest",
            "HiveCatalog": "hive",
            "GlueCatalog": "glue",
        }.get(short)
        if kind is None:
            raise ImportError_(
                f"iceberg.catalog.catalog-impl: {impl!r} has no PyIceberg equivalent; "
                "use a REST, JDBC (SQL), Hive or Glue catalog"
            )
    if kind == "hadoop":
        raise ImportError_(
            "iceberg.catalog.type: a Hadoop catalog has no PyIceberg equivalent; use a REST or JDBC catalog"
        )
    if kind:
        catalog["type"] = "sql" if kind == "jdbc" else kind
    uri = props.pop("uri", None)
    if uri and catalog.get("type") == "sql":
        reader.refs.parsed("iceberg.catalog.uri")
        user, password = props.pop("jdbc.user", None), props.pop("jdbc.password", None)
        jdbc, dropped = sqlalchemy_catalog(uri, user, password, reader.refs)
        catalog.update(jdbc)
        if dropped:
            reader.uncarried.append(
                Uncarried(
                    "iceberg.catalog.uri",
                    f"its parameters {', '.join(dropped)}: pgjdbc settings libpq does not take "
                    "(the sink carries sslmode, sslrootcert, sslcert and sslkey)",
                )
            )
    elif uri:
        catalog["uri"] = uri
    for key in ("io-impl", "clients"):
        if props.pop(key, None) is not None:
            reader.uncarried.append(Uncarried(f"iceberg.catalog.{key}", _CATALOG_JAVA_ONLY[key]))
    for key, value in props.items():
        catalog[_CATALOG_RENAMES.get(key, key)] = value
    return catalog


def _source(reader: _Reader, bootstrap: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    topics, regex = reader.get("topics"), reader.get("topics.regex")
    source: dict[str, Any] = {}
    if topics:
        source["topics"] = [t.strip() for t in topics.split(",") if t.strip()]
    elif regex:
        source["pattern"] = regex
    else:
        raise ImportError_("topics: the connector names no topics (topics or topics.regex)")
    converter = reader.get("value.converter")
    if converter is not None:
        fmt = _CONVERTERS.get(converter)
        if fmt is None:
            raise ImportError_(
                f"value.converter: {converter!r} has no sink format; the sink reads {sorted(_CONVERTERS)}"
            )
        source["format"] = fmt
        registry = reader.prefixed("value.converter.schema.registry.")
        if registry:
            source["schema-registry"] = {
                f"schema.registry.{k}".removeprefix("schema.registry."): v for k, v in registry.items()
            }
        schemas = reader.get("value.converter.schemas.enable")
        if fmt == "json" and schemas is not None and schemas.lower() == "true":
            reader.uncarried.append(
                Uncarried(
                    "value.converter.schemas.enable",
                    "true: Connect's {schema, payload} envelope is unwrapped only for Debezium tables; "
                    "other records are read as the JSON they are (route and select on payload.*)",
                )
            )
        else:
            reader.used.add("value.converter.schemas.enable")
    overrides = reader.prefixed("consumer.override.")
    reset = overrides.pop("auto.offset.reset", "earliest")
    source["starting-offsets"] = "latest" if reset == "latest" else "earliest"
    kafka = reader.prefixed("iceberg.kafka.")
    for key in sorted(overrides):
        if key != "group.id":
            reader.uncarried.append(
                Uncarried(
                    f"consumer.override.{key}",
                    "a Java consumer setting of Connect's task; the sink's own clients take librdkafka "
                    "names under kafka:",
                )
            )
    for key in [
        k
        for k in kafka
        if k in ("sasl.jaas.config",) or k.startswith("ssl.truststore") or k.startswith("ssl.keystore.type")
    ]:
        reader.uncarried.append(
            Uncarried(
                f"iceberg.kafka.{key}",
                "a Java client property librdkafka does not take: give sasl.username/sasl.password or "
                "ssl.ca.location (PEM) under kafka:",
            )
        )
        del kafka[key]
    if bootstrap:
        kafka["bootstrap.servers"] = bootstrap
    if "bootstrap.servers" not in kafka:
        raise ImportError_(
            "iceberg.kafka.bootstrap.servers: not in the connector's config (Connect's worker holds it); "
            "give --bootstrap-servers"
        )
    return source, kafka


def _table_entry(
    reader: _Reader, table: str, defaults: dict[str, Any], route_field: str | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    regex = reader.get(f"iceberg.table.{table}.route-regex")
    if regex is not None:
        if route_field is None:
            raise ImportError_(
                f"iceberg.table.{table}.route-regex: set, but iceberg.tables.route-field is not"
            )
        # The Java sink matches the whole value (Matcher.matches); regex() searches.
        entry["when"] = f"regex({_identifier(route_field)}, {_literal(f'^(?:{regex})$')})"
    partition = reader.get(f"iceberg.table.{table}.partition-by")
    if partition is not None:
        entry["partition-by"] = _partition_by(f"iceberg.table.{table}.partition-by", partition)
    elif "partition-by" in defaults:
        entry["partition-by"] = defaults["partition-by"]
    ids = reader.get(f"iceberg.table.{table}.id-columns")
    key = [c.strip() for c in ids.split(",")] if ids else defaults.get("key")
    if defaults.get("upsert") and key:
        entry["changes"] = {
            "format": "upsert",
            "key": key,
            **({"delete-when": defaults["delete-when"]} if "delete-when" in defaults else {}),
        }
    elif ids:
        reader.uncarried.append(Uncarried(f"iceberg.table.{table}.id-columns", _ID_COLUMNS_REASON))
    branch = reader.get(f"iceberg.table.{table}.commit-branch")
    if branch is not None:
        reader.uncarried.append(
            Uncarried(f"iceberg.table.{table}.commit-branch", "the sink commits to the main branch only")
        )
    for name in ("properties", "auto-create", "evolution", "conversion"):
        if name in defaults:
            entry[name] = defaults[name]
    return entry


_ID_COLUMNS_REASON = (
    "identifier fields without upsert mode: the sink sets a table's identifier fields only for a change "
    "table (changes.key); an append table ignores them"
)


def translate(
    props: Mapping[str, str], bootstrap: str | None = None, sink_name: str | None = None
) -> Imported:
    """The sink YAML for a connector's properties; raises :class:`ImportError_` naming the key it
    cannot take. The YAML is loaded as `run` loads it before it is returned (:func:`check`)."""
    reader = _Reader(as_references(dict(props)))
    connector_class = reader.get("connector.class")
    if connector_class not in CONNECTOR_CLASSES:
        raise ImportError_(
            f"connector.class: {connector_class!r} is not the Iceberg sink; "
            f"expected one of {list(CONNECTOR_CLASSES)}"
        )
    name = reader.get("name") or sink_name
    if not name:
        raise ImportError_(
            "name: the connector's config has no name (it names its groups, connect-<name>): "
            "give it with --name"
        )
    source, kafka = _source(reader, bootstrap)
    catalog = _catalog(reader)
    route_field = reader.get("iceberg.tables.route-field")
    dynamic = reader.flag("iceberg.tables.dynamic-enabled")
    auto_create = reader.flag("iceberg.tables.auto-create-enabled")
    defaults: dict[str, Any] = {"auto-create": auto_create}
    if reader.flag("iceberg.tables.evolve-schema-enabled"):
        defaults["evolution"] = True
    if reader.flag("iceberg.tables.schema-case-insensitive"):
        defaults["conversion"] = {"case-insensitive": True}
    create_props = reader.prefixed("iceberg.tables.auto-create-props.")
    if create_props:
        defaults["properties"] = create_props
    partition = reader.get("iceberg.tables.default-partition-by")
    if partition:
        defaults["partition-by"] = _partition_by("iceberg.tables.default-partition-by", partition)
    ids = reader.get("iceberg.tables.default-id-columns")
    if ids:
        defaults["key"] = [c.strip() for c in ids.split(",") if c.strip()]
    upsert = reader.flag("iceberg.tables.upsert-mode-enabled")
    cdc_field = reader.get("iceberg.tables.cdc-field")
    if upsert or cdc_field:
        defaults["upsert"] = True
        if cdc_field:  # Tabular's CDC field holds I, U or D
            defaults["delete-when"] = f"{_identifier(cdc_field)} == 'D'"
    tables: dict[str, Any] = {}
    for table in [t.strip() for t in (reader.get("iceberg.tables") or "").split(",") if t.strip()]:
        tables[table] = _table_entry(reader, table, defaults, route_field)
        if defaults.get("upsert") and "changes" not in tables[table]:
            raise ImportError_(
                f"iceberg.tables.upsert-mode-enabled: table {table} has no id columns "
                f"(iceberg.table.{table}.id-columns)"
            )
    if ids and not defaults.get("upsert"):
        reader.uncarried.append(Uncarried("iceberg.tables.default-id-columns", _ID_COLUMNS_REASON))
    sink: dict[str, Any] = {"name": sink_name or name, "kafka": kafka, "source": source}
    control: dict[str, Any] = {}
    for key, ours in (
        ("iceberg.control.commit.interval-ms", "commit-interval"),
        ("iceberg.control.commit.timeout-ms", "commit-timeout"),
    ):
        value = reader.get(key)
        if value is not None:
            if not value.strip().isdigit():
                raise ImportError_(f"{key}: {value!r} is not a number of milliseconds")
            control[ours] = f"{int(value)}ms"
    if control:
        sink["control"] = control
    sink["catalog"] = catalog
    if tables:
        sink["tables"] = tables
    if dynamic:
        if not route_field:
            raise ImportError_(
                "iceberg.tables.dynamic-enabled: true needs iceberg.tables.route-field "
                "(the field naming the table)"
            )
        entry: dict[str, Any] = {
            "table": _identifier(route_field),
            "auto-create": auto_create,
            "applies-to": "all",
        }
        for key in ("partition-by", "properties", "evolution", "conversion"):
            if key in defaults:
                entry[key] = defaults[key]
        if defaults.get("upsert"):
            if "key" not in defaults:
                raise ImportError_(
                    "iceberg.tables.upsert-mode-enabled: dynamic tables need "
                    "iceberg.tables.default-id-columns"
                )
            entry["changes"] = {
                "format": "upsert",
                "key": defaults["key"],
                **({"delete-when": defaults["delete-when"]} if "delete-when" in defaults else {}),
            }
        sink["dynamic"] = entry
        if not tables:
            sink.pop("tables", None)
    elif not tables:
        raise ImportError_("iceberg.tables: no tables and dynamic routing off; the connector writes nowhere")
    tolerance = reader.get("errors.tolerance")
    dlq = reader.get("errors.deadletterqueue.topic.name")
    if dlq:
        sink["dead-letter"] = {"topic": dlq}
        if reader.flag("errors.deadletterqueue.context.headers.enable"):
            sink["dead-letter"]["connect-headers"] = True
    if tolerance in ("all", "none"):
        if tolerance == "all" and not dlq:
            reader.uncarried.append(
                Uncarried(
                    "errors.tolerance",
                    "all without a dead-letter queue drops bad records silently; the sink needs a "
                    "dead-letter topic for all, so it stops at the first bad record (none)",
                )
            )
            sink["errors"] = {"tolerance": "none"}
        else:
            sink["errors"] = {"tolerance": tolerance}
    connect_group = (
        reader.get("iceberg.connect.group-id")
        or reader.props.get("consumer.override.group.id")
        or f"connect-{name}"
    )
    control_topic = reader.get("iceberg.control.topic", "control-iceberg") or "control-iceberg"
    tabular_group = reader.get("iceberg.control.group-id")
    control_group = (
        tabular_group
        or (reader.get("iceberg.control.group-id-prefix", "cg-control-") or "cg-control-") + name
    )
    if control_topic == f"{sink['name']}-control":  # the sink's default would share the connector's topic
        sink.setdefault("control", {})["topic"] = f"{sink['name']}-fanout-sink-control"
    for key in _GROUP_KEYS:
        if key in reader.props:
            reader.drop(key, _GROUP_REASON)
    _report_rest(reader, control_topic)
    commit_group = control_group if connector_class == TABULAR_CLASS else connect_group
    imported = Imported(
        sink, reader.uncarried, name, connect_group, control_topic, control_group, commit_group,
        reader.refs.written(yaml.safe_dump(sink)),
    )  # fmt: skip
    check(imported)
    return imported


_GROUP_KEYS = (
    "iceberg.connect.group-id",
    "consumer.override.group.id",
    "iceberg.control.group-id",
    "iceberg.control.group-id-prefix",
)
_GROUP_REASON = (
    "the connector's own group, read by --take-over only; the sink commits to its own group (<name>)"
)

_CONNECT_FRAMEWORK = {
    "tasks.max": "the sink runs a Spark task per partition group (spark.partition-groups), not Connect tasks",
    "key.converter": "message keys are read as text (a change table's keys as JSON), whatever the converter",
}


def _report_rest(reader: _Reader, control_topic: str) -> None:
    """Every key not read yet is listed with a reason: nothing leaves the connector unmentioned."""
    for key in sorted(reader.props):
        if key in reader.used:
            continue
        if key == "iceberg.control.topic":
            continue
        if key in _CONNECT_FRAMEWORK:
            reason = _CONNECT_FRAMEWORK[key]
        elif key.startswith("key.converter."):
            reason = _CONNECT_FRAMEWORK["key.converter"]
        elif key.startswith(("transforms", "predicates")):
            reason = "Single Message Transforms are not run: write them as when/select (routing/README.md)"
        elif key.startswith(("iceberg.hadoop.", "iceberg.hadoop-conf-dir")):
            reason = "Hadoop configuration: give the storage keys (s3.*) under catalog:"
        elif key.startswith("iceberg.tables.write-props."):
            reason = "writer properties come from the table's properties (write.*): set them on the table"
        elif key in ("iceberg.tables.default-commit-branch",):
            reason = "the sink commits to the main branch only"
        elif key == "iceberg.tables.schema-force-optional":
            reason = "no such switch: only a change table's key or a schema file makes a column required"
        elif key in ("iceberg.control.commit.threads", "iceberg.control.commit.max-consecutive-failures"):
            reason = (
                "the coordinator's scheduling (control.distributed-commit-min-tables spreads large rounds)"
            )
        elif key.startswith("iceberg.coordinator"):
            reason = "the connector's own transactional names"
        elif key.startswith("errors."):
            reason = "Connect's retry and error logging; the sink retries batches and logs every dead letter"
        else:
            reason = "no equivalent in the sink"
        reader.uncarried.append(Uncarried(key, reason))
    reader.uncarried.append(
        Uncarried(
            "iceberg.control.topic",
            f"{control_topic!r} carries the Java sink's events; the sink keeps its own (<name>-control). "
            "--take-over reads it to check the connector's last commit completed",
        )
    )


def check(imported: Imported) -> SinkConfig:
    """The YAML the import writes, loaded as `run` loads it: a translation bug fails here, naming the key."""
    text = imported.yaml()
    for var in imported.variables:  # set when `run` starts; any value loads here
        text = text.replace(f"${{{var}}}", "imported-reference")
    return parse_config(yaml.safe_load(text), "<imported connector config>")
