"""Moving over from the Iceberg Kafka Connect sink: its connector config as a sink YAML, and a takeover
that starts each source partition exactly where the connector's tables end.

Both families of the Java sink are read: Apache's ``org.apache.iceberg.connect`` and Tabular's
``io.tabular.iceberg.connect``. The translation (:func:`translate`) contacts nothing; every key it
cannot carry is listed with the reason, so nothing is dropped silently.

The takeover (:func:`take_over`) is exact because of how the Java sink commits. Its worker sends the
``DataWritten`` and ``DataComplete`` events to the connector's control topic and the SOURCE offsets
to Connect's consumer group (``connect-<name>``) in one Kafka transaction; its coordinator appends
the files to the tables later and records the CONTROL-topic offsets it had read in each snapshot's
summary (``kafka.connect.offsets.<control-topic>.<group>``). So the Connect group's offsets are
where the tables end exactly when every data file announced on the control topic reached its table:
a ``DataWritten`` of table T at control offset X is in T when T's newest such summary holds an offset
above X. The takeover refuses while the connector runs (members in its groups), when the group has
no offsets, and when an announced file has not reached its table (a commit in flight, or one the
connector never finished); otherwise it writes those offsets into the sink-managed group the way a
worker does, and the sink's first start reads from there (``protocol/recovery.py``).
"""

from __future__ import annotations

import functools
import io
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import yaml
from confluent_kafka import TopicPartition

from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import FanoutSinkError

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
    "jdbc.user": "carried as the user of catalog.uri",
    "jdbc.password": "carried as the password of catalog.uri",
}
_EVENT_MAGIC = b"\xc2\x01"
_DATA_WRITTEN = 1
_SUMMARY_PREFIX = "kafka.connect.offsets."


class ImportError_(FanoutSinkError):
    """A connector config the sink cannot take, naming the key."""


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

    def yaml(self) -> str:
        header = (
            "# Imported by `fanout-sink import-connect` from the Iceberg Kafka Connect sink "
            f"{self.connector!r}.\n"
            f"# Keys not carried: {len(self.uncarried)} (listed by the command).\n"
        )
        return header + yaml.safe_dump(self.sink, sort_keys=False, allow_unicode=True)


@dataclass
class _Reader:
    """The connector's properties with every key read marked, so the rest can be reported."""

    props: dict[str, str]
    used: set[str] = field(default_factory=set)
    uncarried: list[Uncarried] = field(default_factory=list)

    def get(self, key: str, default: str | None = None) -> str | None:
        if key in self.props:
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
    impl = props.pop("catalog-impl", None)
    kind = props.pop("type", None)
    if impl:
        reader.uncarried.append(Uncarried("iceberg.catalog.catalog-impl", _CATALOG_JAVA_ONLY["catalog-impl"]))
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
        user, password = props.pop("jdbc.user", None), props.pop("jdbc.password", None)
        for key in ("jdbc.user", "jdbc.password"):
            if f"iceberg.catalog.{key}" in reader.props:
                reader.uncarried.append(Uncarried(f"iceberg.catalog.{key}", _CATALOG_JAVA_ONLY[key]))
        uri = _sqlalchemy_uri(uri, user, password)
    if uri:
        catalog["uri"] = uri
    for key in ("io-impl", "clients"):
        if props.pop(key, None) is not None:
            reader.uncarried.append(Uncarried(f"iceberg.catalog.{key}", _CATALOG_JAVA_ONLY[key]))
    for key, value in props.items():
        catalog[_CATALOG_RENAMES.get(key, key)] = value
    return catalog


def _sqlalchemy_uri(uri: str, user: str | None, password: str | None) -> str:
    if uri.startswith("jdbc:sqlite:"):
        path = uri.removeprefix("jdbc:sqlite:").removeprefix("file:")
        return f"sqlite:///{path.lstrip('/')}" if not path.startswith("/") else f"sqlite:///{path}"
    match = re.fullmatch(r"jdbc:postgresql://([^?]+)(\?.*)?", uri)
    if match:
        auth = ""
        if user:
            auth = user + (f":{password}" if password else "") + "@"
        return f"postgresql+psycopg2://{auth}{match.group(1)}"
    raise ImportError_(
        f"iceberg.catalog.uri: {uri!r}: only SQLite and PostgreSQL JDBC URIs have a PyIceberg SQL catalog"
    )


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
    reader = _Reader(dict(props))
    connector_class = reader.get("connector.class")
    if connector_class not in CONNECTOR_CLASSES:
        raise ImportError_(
            f"connector.class: {connector_class!r} is not the Iceberg sink; "
            f"expected one of {list(CONNECTOR_CLASSES)}"
        )
    name = reader.get("name")
    if not name:
        raise ImportError_(
            "name: the connector's name is needed (it names its consumer group connect-<name>)"
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
    _report_rest(reader, control_topic)
    imported = Imported(sink, reader.uncarried, name, connect_group, control_topic, control_group)
    check(imported)
    return imported


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
        elif key.startswith(("iceberg.control.group-id", "iceberg.coordinator", "iceberg.connect.group-id")):
            reason = "the connector's own group and transactional names, read by --take-over only"
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
    return parse_config(yaml.safe_load(imported.yaml()), "<imported connector config>")


# --- the takeover --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Takeover:
    """What the takeover wrote: each source partition's start, and the partitions left to
    ``source.starting-offsets`` (the connector delivered nothing from them)."""

    positions: dict[tuple[str, int], int]
    unstarted: list[tuple[str, int]]


_AVRO_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def avro_short_names(schema: Any) -> Any:
    """The schema with every named type and reference by its short name, namespaces dropped.

    Iceberg Java writes its UUID type as a fixed ``uuid_fixed`` without a namespace inside namespaced
    records, then refers to it by a name fastavro resolves into the enclosing namespace
    (``org.apache.iceberg.connect.events.uuid_fixed``), which it never defined. The events' type
    names are unique without their namespaces (Iceberg names structs ``r<field id>``)."""
    if isinstance(schema, str):
        return schema if schema in _AVRO_PRIMITIVES else schema.rsplit(".", 1)[-1]
    if isinstance(schema, list):
        return [avro_short_names(item) for item in schema]
    if isinstance(schema, dict):
        out = {key: value for key, value in schema.items() if key != "namespace"}
        if schema.get("type") in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
            out["name"] = schema["name"].rsplit(".", 1)[-1]
        for key in ("type", "items", "values"):
            if key in schema:
                out[key] = avro_short_names(schema[key])
        if "fields" in schema:
            out["fields"] = [{**f, "type": avro_short_names(f["type"])} for f in schema["fields"]]
        return out
    return schema


def decode_event(value: bytes) -> dict[str, Any]:
    """One Java sink control event: two magic bytes, the writer's Avro schema (Java's ``writeUTF``:
    a two-byte length), then the datum. Decoded with the schema it carries, so both sink families and
    later event versions read alike."""
    if value[:2] != _EVENT_MAGIC:
        raise ValueError("not an Iceberg Kafka Connect event (no magic bytes)")
    (length,) = struct.unpack(">H", value[2:4])
    schema = fastavro.parse_schema(avro_short_names(json.loads(value[4 : 4 + length].decode("utf-8"))))
    record = fastavro.schemaless_reader(io.BytesIO(value[4 + length :]), schema, None)
    if not isinstance(record, dict):
        raise ValueError("an Iceberg Kafka Connect event is an Avro record")
    return record


def _groups_with_members(admin: Any, groups: list[str], timeout_s: float) -> dict[str, int]:
    """The groups that have members now: the connector (or a task of it) still runs. A group the
    broker never saw is empty; its coordinator may answer NOT_COORDINATOR while loading (retried)."""
    from fanout_sink.kafka.clients import retry_transient

    def members(group: str) -> int:
        description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result()
        return len(description.members)

    found = {group: retry_transient(functools.partial(members, group), timeout_s) for group in groups}
    return {group: count for group, count in found.items() if count}


def _uncommitted_files(imported: Imported, config: SinkConfig, clients: Any) -> list[str]:
    """Each table whose data files the connector announced but did not commit, with the control
    offset of the newest such announcement (empty: every announced file is in its table)."""
    from fanout_sink.catalog import load_catalog

    consumer = clients.consumer(
        {
            "group.id": f"{config.name}-takeover-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    announced: dict[str, tuple[int, int]] = {}  # table -> (partition, offset) of its newest DataWritten
    try:
        metadata = consumer.list_topics(imported.control_topic, timeout=clients.timeout_s)
        topic = metadata.topics.get(imported.control_topic)
        if topic is None or topic.error is not None:
            raise ImportError_(
                f"iceberg.control.topic: {imported.control_topic!r} does not exist on the broker; the "
                "connector never ran, or this is not its config"
            )
        for partition in topic.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(imported.control_topic, partition), timeout=clients.timeout_s
            )
            if high <= low:
                continue
            consumer.assign([TopicPartition(imported.control_topic, partition, low)])
            position = low
            while position < high:
                message = consumer.poll(clients.timeout_s)
                if message is None:
                    break  # read_committed: the last stable offset can stay below high (markers)
                if message.error() is not None:
                    raise ImportError_(
                        f"iceberg.control.topic: reading {imported.control_topic!r} failed: {message.error()}"
                    )
                position = message.offset() + 1
                if not message.value() or message.value()[:2] != _EVENT_MAGIC:
                    continue  # not the Java sink's: no announcement of its files
                event = decode_event(message.value())
                if event.get("group_id") != imported.connect_group or event.get("type") != _DATA_WRITTEN:
                    continue
                payload = event.get("payload") or {}
                if not (payload.get("data_files") or payload.get("delete_files")):
                    continue
                ref = payload.get("table_reference") or payload.get("table_name") or {}
                table = ".".join([*ref.get("namespace", []), ref.get("name", "")])
                announced[table] = max(announced.get(table, (partition, -1)), (partition, message.offset()))
    finally:
        consumer.close()
    catalog = load_catalog(config.catalog, create=False)
    problems = []
    for table, (partition, offset) in sorted(announced.items()):
        committed = _summary_control_offset(catalog.load_table(table), imported, partition)
        if committed is None or committed <= offset:
            problems.append(
                f"{table}: data files announced at {imported.control_topic}[{partition}]@{offset}, the "
                f"table's commits recorded up to {committed}"
            )
    return problems


def _summary_control_offset(table: Any, imported: Imported, partition: int) -> int | None:
    """The control offset this connector's coordinator recorded in the newest snapshot it made.

    The key names the control topic and the coordinator's control group (Apache: ``cg-control-<name>``
    or ``iceberg.control.group-id-prefix`` + name; Tabular: ``iceberg.control.group-id``); Connect's
    group is accepted too. Connectors share the default control topic (``control-iceberg``), so
    another connector's commits to the same table must not count."""
    keys = {
        f"{_SUMMARY_PREFIX}{imported.control_topic}.{group}"
        for group in (imported.connect_group, imported.control_group)
    }
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        for key in keys & set(summary):
            offsets = json.loads(summary[key])
            return int(offsets[str(partition)]) if str(partition) in offsets else None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return None


def take_over(imported: Imported, config: SinkConfig) -> Takeover:
    """Seed the sink group with the connector's source offsets, once the connector is stopped and its
    last commit completed; raises :class:`ImportError_` saying what to do otherwise."""
    from fanout_sink.kafka.offsets import GroupOffsets
    from fanout_sink.protocol.group_layout import channel_in_use
    from fanout_sink.protocol.recovery import PositionWriter, delivered_offsets
    from fanout_sink.spark.planning import source_partitions

    channel = channel_in_use(config)
    clients = channel.clients
    running = _groups_with_members(
        clients.admin(), [imported.connect_group, imported.control_group], clients.timeout_s
    )
    if running:
        raise ImportError_(
            f"name: the connector {imported.connector!r} still runs ({running} members): stop it first "
            f"(`curl -X DELETE <connect>/connectors/{imported.connector}`, or stop Connect standalone), "
            "then run --take-over again"
        )
    partitions = source_partitions(config, channel)
    wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
    reader = GroupOffsets(clients, imported.connect_group, stable=True)  # waits for pending transactions
    try:
        found = {key: value for key, value in reader.committed(wanted).items() if value is not None}
    finally:
        reader.close()
    if not found:
        raise ImportError_(
            f"name: the connector's group {imported.connect_group!r} has no offsets for "
            f"{sorted(partitions)}: "
            "nothing to take over from; run the sink without --take-over (source.starting-offsets decides)"
        )
    ours = delivered_offsets(channel, wanted)
    if ours:
        raise ImportError_(
            f"name: the sink group {channel.sink_group!r} already holds offsets ({len(ours)} partitions): "
            "this sink has run; a takeover is only for its first start"
        )
    problems = _uncommitted_files(imported, config, clients)
    if problems:
        raise ImportError_(
            "iceberg.control.topic: the connector's last commit did not complete, so its group's offsets are "
            "ahead of its tables: " + "; ".join(problems) + ". Start the connector again until it logs a "
            "completed commit, stop it, and run --take-over again"
        )
    writer = PositionWriter(channel)
    try:
        for (topic, part), offset in sorted(found.items()):
            held = writer.commit(topic, part, offset, expected=None)
            if held is not None and held != offset:
                raise ImportError_(
                    f"name: the sink group got offset {held} for {topic}[{part}] meanwhile: "
                    "is the sink running?"
                )
    finally:
        writer.close()
    return Takeover(found, [key for key in wanted if key not in found])
