"""The YAML config: typed models, errors that name the path and the fix, env vars, secrets."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.fields import PartitionField, parse_duration
from fanout_sink.config.loading import load_config, parse_config, write_standalone_copy
from fanout_sink.config.secrets import is_secret_key
from fanout_sink.errors import ConfigError
from fanout_sink.user_info import redact_url

DESIGN_SKETCH = """
name: shop-events
kafka: {bootstrap.servers: 127.0.0.1:9092}
source: {topics: [orders, payments], format: json}
control: {topic: shop-events-control, commit-interval: 30s, commit-timeout: 60s}
catalog: {name: lake, type: sql, uri: "sqlite:///warehouse/catalog.db", warehouse: "file:///warehouse"}
tables:
  analytics.orders:
    when: "type == 'order'"
    select: "{id: id, customer: customer.id, total: amount, ts: ts}"
    partition-by: ["day(ts)"]
  analytics.payments: {when: "type == 'payment'"}
dynamic: {table: "join('.', ['raw', topic])", allow: "^raw\\\\.[a-z0-9_]+$", auto-create: true}
dead-letter: {topic: shop-events-dlq}
"""


def _base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "shop",
        "source": {"topics": ["orders"]},
        "tables": {"analytics.orders": {}},
    }
    data.update(overrides)
    return data


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "sink.yaml")
    return str(info.value)


def test_design_sketch_loads(tmp_path: Path) -> None:
    path = tmp_path / "sink.yaml"
    path.write_text(DESIGN_SKETCH)
    config = load_config(path)
    assert config.name == "shop-events"
    assert config.kafka == {"bootstrap.servers": "127.0.0.1:9092"}
    assert config.source.topics == ["orders", "payments"]
    assert config.control.commit_interval == timedelta(seconds=30)
    assert config.control.commit_timeout == timedelta(minutes=1)
    assert isinstance(config.catalog, CatalogSettings)
    assert config.catalog.name == "lake"
    orders = config.tables["analytics.orders"]
    assert orders.partition_by == [PartitionField(transform="day", column="ts")]
    assert config.tables["analytics.payments"].when == "type == 'payment'"
    assert config.dynamic is not None and config.dynamic.auto_create
    assert config.dead_letter is not None and config.dead_letter.topic == "shop-events-dlq"
    assert config.errors.tolerance == "all"  # a dead-letter topic is configured
    assert config.base_dir == tmp_path


def test_partition_error_names_path_problem_and_example() -> None:
    message = _error(_base(tables={"analytics.orders": {"partition-by": ["id", "dayz(ts)"]}}))
    assert message == (
        "sink.yaml: tables.\"analytics.orders\".partition-by[1]: unknown transform 'dayz(ts)'; use one of "
        'identity, bucket[N], truncate[W], year, month, day, hour, e.g. "day(ts)"'
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ts", PartitionField(transform="identity", column="ts")),
        ("identity(region)", PartitionField(transform="identity", column="region")),
        ("bucket[16](id)", PartitionField(transform="bucket", column="id", argument=16)),
        ("truncate[4](name)", PartitionField(transform="truncate", column="name", argument=4)),
        ("year(ts)", PartitionField(transform="year", column="ts")),
        ("month(ts)", PartitionField(transform="month", column="ts")),
        ("hour(ts)", PartitionField(transform="hour", column="ts")),
    ],
)
def test_partition_transforms(text: str, expected: PartitionField) -> None:
    assert PartitionField.parse(text) == expected


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (_base(tables={"analytics.orders": {"whenn": "x"}}), 'tables."analytics.orders".whenn: unknown key'),
        (_base(tables={"analytics.orders": {"when": "type =="}}), "e.g. \"type == 'order'\""),
        (_base(tables={"orders": {}}), 'e.g. "analytics.orders"'),
        (_base(control={"commit-interval": "soon"}), "control.commit-interval: not a duration"),
        (_base(source={"topics": ["a"], "format": "xml"}), "source.format:"),
        (_base(source={"topics": ["a"], "format": "avro"}), "schema: schemas/order.avsc"),
        (_base(source={"topics": ["a"], "format": "confluent-avro"}), "schema-registry: {url:"),
        (_base(source={}), "give topics or pattern"),
        (_base(unmatched={"action": "dead-letter"}), "sink.yaml: unmatched.action: sends records"),
        (
            _base(unmatched={"action": "table", "table": "a.other"}),
            "unmatched.table: 'a.other' is not declared",
        ),
        (_base(tables={}), "sink.yaml: tables: nothing to route to"),
        (_base(name="bad name!"), "name:"),
        (_base(tables={"analytics.orders": {"partition-by": ["bucket(id)"]}}), "bucket[16](id)"),
        (_base(dynamic={"table": "topic", "allow": "(["}), "not a regular expression"),
        (_base(spark={"max-offsets-per-trigger": 0}), "spark.max-offsets-per-trigger"),
        (_base(maintenance={"interval": "soon"}), "maintenance.interval: not a duration"),
        (_base(maintenance={"min-input-files": 0}), "maintenance.min-input-files"),
        (_base(maintenance={"orphan-older-than": 0}), "maintenance.orphan-older-than: must be positive"),
        (_base(maintenance={"sort-order": "ts DOWN"}), 'e.g. "ts, id DESC NULLS LAST"'),
        (
            _base(tables={"analytics.orders": {"maintenance": {"max-snapshot-ag": "1d"}}}),
            'tables."analytics.orders".maintenance.max-snapshot-ag: unknown key',
        ),
    ],
)
def test_bad_configs_fail_with_path_and_fix(data: dict[str, Any], fragment: str) -> None:
    message = _error(data)
    assert message.startswith("sink.yaml: ")
    assert fragment in message


def test_missing_required_key_gives_example() -> None:
    message = _error({"source": {"topics": ["a"]}, "tables": {"a.b": {}}})
    assert 'name: Field required; e.g. "shop-events"' in message


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "sink.yaml"
    path.write_text("name: x\nsource: {topics: [a]\n")
    with pytest.raises(ConfigError, match=r"sink.yaml: line \d+, column \d+: not valid YAML"):
        load_config(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/sink.yaml")


def test_durations() -> None:
    assert parse_duration("30s") == timedelta(seconds=30)
    assert parse_duration("5m") == timedelta(minutes=5)
    assert parse_duration("1h") == timedelta(hours=1)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    assert parse_duration(12) == timedelta(seconds=12)
    with pytest.raises(ValueError, match=r"e\.g\. 30s"):
        parse_duration("5 minutes")


def test_env_substitution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SASL_PASSWORD", "s3cret")
    config = parse_config(
        _base(
            kafka={
                "sasl.username": "${SASL_USER:-sink}",
                "sasl.password": "${SASL_PASSWORD}",
                "sasl.mechanism": "PLAIN",
            },
        ),
        "sink.yaml",
    )
    assert config.kafka == {"sasl.username": "sink", "sasl.password": "s3cret", "sasl.mechanism": "PLAIN"}
    monkeypatch.delenv("SASL_PASSWORD")
    message = _error(_base(kafka={"sasl.password": "${SASL_PASSWORD}"}))
    assert 'kafka."sasl.password": environment variable SASL_PASSWORD is not set' in message


def test_secrets_are_redacted() -> None:
    config = parse_config(
        _base(
            kafka={
                "bootstrap.servers": "b:9092",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "sink",
                "sasl.password": "kafka-secret",
                "ssl.key.password": "k2",
            },
            source={
                "topics": ["a"],
                "format": "confluent-avro",
                "schema-registry": {"url": "http://r", "basic.auth.user.info": "user:registry-secret"},
            },
            catalog={"name": "lake", "s3.secret-access-key": "store-secret", "s3.access-key-id": "AKIA"},
        ),
        "sink.yaml",
    )
    for text in (repr(config), str(config), str(config.redacted())):
        for secret in ("kafka-secret", "k2", "registry-secret", "store-secret", "AKIA"):
            assert secret not in text
    assert config.redacted()["kafka"]["bootstrap.servers"] == "b:9092"
    assert is_secret_key("sasl.password") and is_secret_key("basic.auth.user.info")
    assert is_secret_key("adls.account-key") and is_secret_key("fs.s3a.access.key")
    assert not is_secret_key("bootstrap.servers")


def test_defaults_and_spark_section() -> None:
    config = parse_config(
        _base(spark={"master": "local[2]", "trigger-interval": "5s", "checkpoint-location": "/tmp/c"}), "x"
    )
    assert config.control.topic == "shop-control"
    assert config.errors.tolerance == "none"  # no dead-letter topic
    assert config.spark.trigger_interval == timedelta(seconds=5)
    assert config.spark.checkpoint_location == "/tmp/c"
    assert config.source.tombstones == "skip"
    assert config.source.starting_offsets == "earliest"


def test_evolution_shorthand() -> None:
    config = parse_config(_base(tables={"a.b": {"evolution": True}}), "x")
    evolution = config.tables["a.b"].evolution
    assert evolution.add_columns and evolution.widen_types and evolution.make_optional


def test_schema_files_checked_at_load(tmp_path: Path) -> None:
    message = _error(_base(tables={"analytics.orders": {"schema": str(tmp_path / "missing.avsc")}}))
    assert 'tables."analytics.orders".schema: schema file' in message and "not found" in message
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "R", "fields": [{"name": "x", "type": ["int", "string"]}]}')
    message = _error(_base(source={"topics": ["a"], "format": "avro", "schema": str(bad)}))
    assert "source.schema: Avro union" in message


def test_sink_topics_settings() -> None:
    """The control topic keeps its events 7 days unless told otherwise (start-up reads only its tail,
    so a finite retention is safe); replication follows the broker (None here) unless set;
    min-insync-replicas above replication-factor is refused, and so is a retention under an hour."""
    defaults = parse_config(_base(), "x").control.topic_settings()
    assert dict(defaults.config) == {
        "cleanup.policy": "delete",
        "retention.ms": "604800000",
        "retention.bytes": "-1",
    }
    forever = parse_config(_base(control={"retention-ms": -1}), "x").control.topic_settings()
    assert forever.config["retention.ms"] == "-1"
    assert "retention-ms 60000 is shorter than an hour" in _error(_base(control={"retention-ms": 60_000}))
    assert (defaults.replication_factor, defaults.min_insync_replicas) == (None, None)
    config = parse_config(
        _base(
            control={"retention-ms": 2_592_000_000, "replication-factor": 3, "min-insync-replicas": 2},
            **{"dead-letter": {"topic": "dlq", "replication-factor": 3}},
        ),
        "x",
    )
    control = config.control.topic_settings()
    assert (control.config["retention.ms"], control.replication_factor, control.min_insync_replicas) == (
        "2592000000",
        3,
        2,
    )
    assert config.dead_letter is not None and config.dead_letter.topic_settings().replication_factor == 3
    message = _error(_base(control={"replication-factor": 1, "min-insync-replicas": 2}))
    assert "control: min-insync-replicas 2 is more than replication-factor 1" in message


def test_commit_cadence_defaults_and_a_minimum_beyond_the_interval_is_refused() -> None:
    control = parse_config(_base(), "x").control
    assert control.commit_min_interval == timedelta(seconds=2)
    short = parse_config(_base(control={"commit-interval": "1s"}), "x").control
    assert short.commit_min_interval > short.commit_interval, "the default is capped where it is used"
    message = _error(_base(control={"commit-interval": "10s", "commit-min-interval": "1m"}))
    assert "control: commit-min-interval (0:01:00) is longer than commit-interval (0:00:10)" in message


def test_a_tables_own_commit_interval_its_dynamic_default_and_its_bounds_with_the_yaml_path() -> None:
    """A route's ``commit-interval`` (issue 50 item 2): unset, every round; ``dynamic`` sets it for the
    tables it names, not for declared ones; refused with its YAML path when it is no duration, not
    positive, shorter than the round cadence or longer than half of what the control topic keeps."""
    config = parse_config(
        _base(
            tables={"analytics.orders": {"commit-interval": "10m"}, "analytics.payments": {}},
            dynamic={"table": "join('.', ['raw', topic])", "commit-interval": "1h"},
        )
    )
    assert config.commit_interval_for("analytics.orders") == timedelta(minutes=10)
    assert config.commit_interval_for("analytics.payments") is None
    assert config.commit_interval_for("raw.clicks") == timedelta(hours=1)
    assert parse_config(_base()).commit_interval_for("analytics.orders") is None
    kept = {"retention-ms": -1}  # every event kept: any interval fits
    assert parse_config(
        _base(control=kept, tables={"analytics.orders": {"commit-interval": "3650d"}})
    ).commit_interval_for("analytics.orders") == timedelta(days=3650)

    def table(interval: str, **control: Any) -> str:
        return _error(_base(control=control, tables={"analytics.orders": {"commit-interval": interval}}))

    assert 'tables."analytics.orders".commit-interval: not a duration' in table("soon")
    assert 'tables."analytics.orders".commit-interval: must be positive' in table("0s")
    short = table("10s", **{"commit-interval": "30s"})
    path = 'sink.yaml: tables."analytics.orders".commit-interval: '
    assert path + "10s is shorter than control.commit-interval" in short
    long = table("4d")  # the default retention keeps 7 days
    assert path + "345600s is more than half of control.retention-ms" in long
    dynamic = _error(_base(dynamic={"table": "topic", "commit-interval": "5s"}))
    assert "sink.yaml: dynamic.commit-interval: 5s is shorter than control.commit-interval" in dynamic
    assert len(long.splitlines()) == 1


def test_maintenance_defaults_and_per_table_overrides() -> None:
    config = parse_config(
        _base(
            maintenance={"interval": "10m", "min-input-files": 3, "max-snapshot-age": "1d"},
            tables={
                "analytics.orders": {"maintenance": {"min-input-files": 8, "sort-order": "ts, id DESC"}},
                "analytics.payments": {},
            },
        )
    )
    orders = config.maintenance_for("analytics.orders")
    assert (orders.min_input_files, orders.sort_order, orders.interval) == (
        8,
        "ts, id DESC",
        timedelta(minutes=10),
    )
    assert orders.max_snapshot_age == timedelta(days=1)
    payments, dynamic = config.maintenance_for("analytics.payments"), config.maintenance_for("raw.x")
    assert payments == dynamic == config.maintenance
    assert (payments.min_input_files, payments.sort_order) == (3, None)
    default = parse_config(_base()).maintenance
    assert default.interval is None and default.orphan_older_than == timedelta(days=3)
    assert (default.min_input_files, default.min_snapshots_to_keep, default.rewrite_manifests_min_count) == (
        5,
        None,
        100,
    )


def test_credentials_inside_urls_and_under_api_key_headers_are_redacted() -> None:
    """Issue 24 item 7: secrets are found by value too (a password in a URL's user info) and under
    API-key header names, not by secret-looking key names alone."""
    config = parse_config(
        _base(
            source={
                "topics": ["a"],
                "format": "confluent-avro",
                "schema-registry": {"url": "https://registry-user:registry-pw@registry.example:8081"},
            },
            catalog={
                "name": "lake",
                "type": "rest",
                "uri": "https://rest-user:rest-pw@catalog.example/api",
                "header.X-Api-Key": "ak-7f3d9e",
            },
        ),
        "sink.yaml",
    )
    for text in (repr(config), str(config), str(config.redacted())):
        for secret in ("registry-pw", "rest-pw", "ak-7f3d9e"):
            assert secret not in text, f"{secret} visible in {text[:400]}"
    redacted = config.redacted()
    assert redacted["source"]["schema_registry"]["url"] == "https://registry-user:***@registry.example:8081"
    assert is_secret_key("header.X-Api-Key") and is_secret_key("apikey")


def test_a_slash_in_a_password_any_header_and_a_token_only_url_are_redacted() -> None:
    """Issue 33 item 6: SQLAlchemy takes ``/`` inside a password, a header can carry a secret under
    any name (``X-Auth``, ``Cookie``), and a URL's user info may be a token without a password."""
    config = parse_config(
        _base(
            source={
                "topics": ["a"],
                "format": "confluent-avro",
                "schema-registry": {"url": "https://tok3n-9a8b@registry.example:8081"},
            },
            catalog={
                "name": "lake",
                "type": "rest",
                "uri": "https://rest-user:re/st-pw@catalog.example/api",
                "header.X-Auth": "xauth-5c1e",
                "header.Cookie": "session=ck-77d2",
            },
        ),
        "sink.yaml",
    )
    for text in (repr(config), str(config), str(config.redacted())):
        for secret in ("re/st-pw", "st-pw", "tok3n", "xauth-5c1e", "ck-77d2"):
            assert secret not in text, f"{secret} visible in {text[:400]}"
    redacted = config.redacted()
    assert redacted["catalog"]["uri"] == "https://rest-user:***@catalog.example/api"
    assert redacted["source"]["schema_registry"]["url"] == "https://***@registry.example:8081"
    assert redact_url("postgresql://u:p/w:x@h:5432/db and s3://bucket/key@v2") == (
        "postgresql://u:***@h:5432/db and s3://bucket/key@v2"
    )


def test_a_standalone_copy_resolves_only_the_named_variables_and_schema_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the demo leaves beside its tables: usable from any folder without the demo's variables,
    and no other variable's value (a secret, say) written into the file."""
    source = tmp_path / "routing" / "sink.yaml"
    (tmp_path / "schemas").mkdir()
    (tmp_path / "routing").mkdir()
    (tmp_path / "schemas" / "orders.avsc").write_text(
        '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
    )
    source.write_text(
        "name: copy\n"
        "kafka: {bootstrap.servers: '${BROKER:-127.0.0.1:9092}'}\n"
        "source: {topics: [orders], format: json}\n"
        "catalog: {name: lake, uri: 'sqlite:///${WORK}/catalog.db', warehouse: 'file://${WORK}/wh',"
        " s3.secret-access-key: '${S3_SECRET}'}\n"
        "tables: {shop.orders: {when: 'true', schema: ../schemas/orders.avsc}}\n"
    )
    monkeypatch.setenv("WORK", str(tmp_path / "work"))
    monkeypatch.setenv("BROKER", "10.0.0.1:9093")
    monkeypatch.setenv("S3_SECRET", "hunter2")

    copy = write_standalone_copy(source, tmp_path / "copy.yaml", ["WORK", "BROKER"])

    text = copy.read_text()
    assert "hunter2" not in text and "${S3_SECRET}" in text
    monkeypatch.delenv("WORK")
    monkeypatch.delenv("BROKER")
    monkeypatch.chdir(tmp_path / "schemas")
    config = load_config(copy)
    assert config.catalog.uri == f"sqlite:///{tmp_path}/work/catalog.db"
    assert config.kafka["bootstrap.servers"] == "10.0.0.1:9093"
    assert config.tables["shop.orders"].schema_file == str(tmp_path / "schemas" / "orders.avsc")


@pytest.mark.parametrize(
    ("tables", "path", "fragment"),
    [
        ({"a.t": {"when": "nope(type)"}}, 'tables."a.t".when', "calls nope(), which jmespath does not have"),
        (
            {"a.t": {"when": "type == 'order' && starts_with(type)"}},
            'tables."a.t".when',
            "starts_with() takes 2 arguments, not 1",
        ),
        ({"a.t": {"when": "regex(sku, '[')"}}, 'tables."a.t".when', "regex() pattern '[' is not a regular"),
        ({"a.t": {"select": "{id: tostring(id)}"}}, 'tables."a.t".select', "calls tostring()"),
        ({"a.t": {"select": "merge()"}}, 'tables."a.t".select', "merge() takes at least 1 argument, not 0"),
        (
            {"a.t": {"changes": {"format": "upsert", "key": ["id"], "delete-when": "ends_with(status)"}}},
            'tables."a.t".changes.delete-when',
            "ends_with() takes 2 arguments, not 1",
        ),
    ],
)
def test_an_expression_calling_an_unknown_function_or_with_the_wrong_argument_count_is_refused(
    tables: dict[str, Any], path: str, fragment: str
) -> None:
    """Issue 47 item 5: such a ``when`` compiled, so it passed ``validate`` and at run time raised on
    every record, which read as "no match": every record filtered, exit 0. Refused on load now (so by
    ``validate`` and by the start), with the expression's YAML path, as a syntax error is."""
    message = _error(_base(tables=tables))
    assert f"sink.yaml: {path}: " in message and fragment in message, message


def test_a_dynamic_name_with_the_wrong_argument_count_is_refused() -> None:
    message = _error(_base(dynamic={"table": "join('.')"}))
    assert "sink.yaml: dynamic.table: " in message and "join() takes 2 arguments, not 1" in message


@pytest.mark.parametrize(
    "expression",
    [
        "merge(user, {tags: user.tags[?starts_with(@, 'vip')]})",
        "not_null(a, b, c) && regex(sku, '^[A-Z]{3}-')",
        "sort_by(items, &price)[0].id == `1`",
        "length(type) > `5` || contains(['a'], type)",
    ],
)
def test_expressions_calling_known_functions_rightly_load(expression: str) -> None:
    config = parse_config(_base(tables={"a.t": {"when": expression}}), "sink.yaml")
    assert config.tables["a.t"].when == expression
