"""`fanout-sink import-connect`: an Iceberg Kafka Connect sink's config (Apache and Tabular keys) as a
sink YAML that loads and validates, every key it cannot carry listed with a reason
(``connect_import/translator.py``; the takeover's checks are in ``test_connect_import_takeover.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fanout_sink.cli import main
from fanout_sink.config.loading import load_config
from fanout_sink.connect_import import translator

APACHE = {
    "name": "events-sink",
    "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
    "tasks.max": "2",
    "topics": "orders,payments",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter.schemas.enable": "false",
    "iceberg.tables": "shop.orders,shop.payments",
    "iceberg.tables.route-field": "meta.type",
    "iceberg.table.shop.orders.route-regex": "order|ord",
    "iceberg.table.shop.orders.partition-by": "days(ts),bucket(id, 16)",
    "iceberg.table.shop.payments.route-regex": "payment",
    "iceberg.table.shop.payments.id-columns": "id",
    "iceberg.tables.default-partition-by": "truncate(customer, 4)",
    "iceberg.tables.auto-create-enabled": "true",
    "iceberg.tables.auto-create-props.format-version": "2",
    "iceberg.tables.evolve-schema-enabled": "true",
    "iceberg.tables.schema-case-insensitive": "true",
    "iceberg.tables.write-props.write.parquet.compression-codec": "zstd",
    "iceberg.control.topic": "events-control",
    "iceberg.control.commit.interval-ms": "120000",
    "iceberg.control.commit.timeout-ms": "30000",
    "iceberg.control.commit.threads": "4",
    "iceberg.catalog": "lake",
    "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
    "iceberg.catalog.uri": "jdbc:postgresql://pg:5432/iceberg",
    "iceberg.catalog.jdbc.user": "sink",
    "iceberg.catalog.jdbc.password": "secret",
    "iceberg.catalog.warehouse": "s3://bucket/wh",
    "iceberg.catalog.s3.endpoint": "http://s3:9000",
    "iceberg.catalog.client.region": "eu-west-1",
    "iceberg.catalog.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
    "iceberg.kafka.bootstrap.servers": "broker:9092",
    "iceberg.kafka.security.protocol": "SASL_SSL",
    "iceberg.kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required;",
    "iceberg.hadoop.fs.s3a.endpoint": "http://s3:9000",
    "errors.tolerance": "all",
    "errors.deadletterqueue.topic.name": "events-dlq",
    "errors.deadletterqueue.context.headers.enable": "true",
    "transforms": "flatten",
    "transforms.flatten.type": "org.apache.kafka.connect.transforms.Flatten$Value",
}

TABULAR = {
    "name": "cdc-sink",
    "connector.class": "io.tabular.iceberg.connect.IcebergSinkConnector",
    "topics.regex": "crm\\..*",
    "iceberg.tables.dynamic-enabled": "true",
    "iceberg.tables.route-field": "table-name",
    "iceberg.tables.upsert-mode-enabled": "true",
    "iceberg.tables.cdc-field": "_op",
    "iceberg.tables.default-id-columns": "id,region",
    "iceberg.tables.auto-create-enabled": "true",
    "iceberg.tables.default-commit-branch": "audit",
    "iceberg.control.group-id": "cg-cdc",
    "iceberg.catalog": "rest",
    "iceberg.catalog.type": "rest",
    "iceberg.catalog.uri": "http://catalog:8181",
    "iceberg.kafka.bootstrap.servers": "broker:9092",
    "consumer.override.auto.offset.reset": "latest",
    "consumer.override.max.poll.records": "500",
}


def _reasons(imported: translator.Imported) -> dict[str, str]:
    return {item.key: item.reason for item in imported.uncarried}


def test_apache_keys_become_tables_routes_partitions_catalog_and_control() -> None:
    imported = translator.translate(APACHE)
    sink = imported.sink
    assert sink["name"] == "events-sink"
    assert sink["source"] == {
        "topics": ["orders", "payments"],
        "format": "json",
        "starting-offsets": "earliest",
    }
    orders = sink["tables"]["shop.orders"]
    assert orders["when"] == "regex(meta.type, '^(?:order|ord)$')"
    assert orders["partition-by"] == ["day(ts)", "bucket[16](id)"]
    assert sink["tables"]["shop.payments"]["partition-by"] == ["truncate[4](customer)"]
    assert orders["auto-create"] is True and orders["evolution"] is True
    assert orders["properties"] == {"format-version": "2"}
    assert orders["conversion"] == {"case-insensitive": True}
    assert (
        "changes" not in sink["tables"]["shop.payments"]
    )  # id columns without upsert: identifier fields only
    assert sink["control"] == {"commit-interval": "120000ms", "commit-timeout": "30000ms"}
    assert sink["catalog"] == {
        "name": "lake", "type": "sql", "uri": "postgresql+psycopg2://pg:5432/iceberg",
        "jdbc.user": "sink", "jdbc.password": "${ICEBERG_CATALOG_JDBC_PASSWORD}",
        "warehouse": "s3://bucket/wh", "s3.endpoint": "http://s3:9000", "s3.region": "eu-west-1",
    }  # fmt: skip
    assert sink["kafka"] == {"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL"}
    assert sink["dead-letter"] == {"topic": "events-dlq", "connect-headers": True}
    assert sink["errors"] == {"tolerance": "all"}
    assert (imported.connect_group, imported.control_topic, imported.control_group) == (
        "connect-events-sink", "events-control", "cg-control-events-sink",
    )  # fmt: skip


def test_every_key_left_out_is_listed_with_its_reason() -> None:
    reasons = _reasons(translator.translate(APACHE))
    for key in (
        "tasks.max", "iceberg.table.shop.payments.id-columns",
        "iceberg.tables.write-props.write.parquet.compression-codec",
        "iceberg.control.commit.threads", "iceberg.catalog.io-impl",
        "iceberg.kafka.sasl.jaas.config", "iceberg.hadoop.fs.s3a.endpoint",
        "transforms", "transforms.flatten.type", "iceberg.control.topic",
    ):  # fmt: skip
        assert reasons.get(key), key
    assert "Single Message Transforms" in reasons["transforms"]
    assert "librdkafka" in reasons["iceberg.kafka.sasl.jaas.config"]
    assert "change table" in reasons["iceberg.table.shop.payments.id-columns"]
    carried = {"name", "connector.class", "topics", "iceberg.tables", "iceberg.table.shop.orders.route-regex"}
    assert not carried & set(reasons)


def test_tabular_keys_become_a_dynamic_upsert_route_with_its_cdc_field() -> None:
    imported = translator.translate(TABULAR)
    sink = imported.sink
    assert sink["source"] == {"pattern": "crm\\..*", "starting-offsets": "latest"}
    assert sink["dynamic"] == {
        "table": '"table-name"', "auto-create": True, "applies-to": "all",
        "changes": {"format": "upsert", "key": ["id", "region"], "delete-when": "_op == 'D'"},
    }  # fmt: skip
    assert "tables" not in sink
    assert sink["catalog"] == {"name": "rest", "type": "rest", "uri": "http://catalog:8181"}
    assert imported.control_group == "cg-cdc"
    reasons = _reasons(imported)
    assert "main branch" in reasons["iceberg.tables.default-commit-branch"]
    assert "librdkafka" in reasons["consumer.override.max.poll.records"]


def test_static_upsert_tables_take_their_id_columns_as_keys() -> None:
    props = {
        **{k: v for k, v in TABULAR.items() if not k.startswith("iceberg.tables.dynamic")},
        "iceberg.tables": "crm.accounts",
        "iceberg.table.crm.accounts.id-columns": "account_id",
        "iceberg.table.crm.accounts.route-regex": "accounts",
    }
    table = translator.translate(props).sink["tables"]["crm.accounts"]
    assert table["changes"] == {"format": "upsert", "key": ["account_id"], "delete-when": "_op == 'D'"}
    assert table["when"] == "regex(\"table-name\", '^(?:accounts)$')"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"connector.class": "io.confluent.connect.s3.S3SinkConnector"}, "connector.class"),
        ({"iceberg.table.shop.orders.partition-by": "zorder(a)"}, "iceberg.table.shop.orders.partition-by"),
        ({"iceberg.control.commit.interval-ms": "2m"}, "iceberg.control.commit.interval-ms"),
        ({"iceberg.tables.auto-create-enabled": "yes"}, "iceberg.tables.auto-create-enabled"),
        ({"iceberg.kafka.bootstrap.servers": None}, "iceberg.kafka.bootstrap.servers"),
        ({"value.converter": "org.apache.kafka.connect.storage.StringConverter"}, "value.converter"),
        (
            {"iceberg.catalog.catalog-impl": "org.apache.iceberg.hadoop.HadoopCatalog"},
            "iceberg.catalog.catalog-impl",
        ),
        ({"topics": None}, "topics"),
    ],
)
def test_a_config_the_sink_cannot_take_names_the_key(change: dict[str, str | None], key: str) -> None:
    props = {k: v for k, v in {**APACHE, **change}.items() if v is not None}
    with pytest.raises(translator.ImportError_, match=f"^{key}: "):
        translator.translate(props)


def test_the_command_writes_a_yaml_the_loader_takes_and_lists_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    connector = tmp_path / "connector.json"
    props = {**APACHE, "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
             "iceberg.catalog.uri": f"jdbc:sqlite:{tmp_path}/catalog.db",
             "iceberg.catalog.warehouse": f"file://{tmp_path}/wh"}  # fmt: skip
    props.pop("iceberg.kafka.bootstrap.servers")
    connector.write_text(json.dumps({"name": props.pop("name"), "config": props}))
    out = tmp_path / "sink.yaml"
    assert (
        main(["import-connect", str(connector), "--out", str(out), "--bootstrap-servers", "127.0.0.1:9092"])
        == 0
    )
    config = load_config(out)
    assert config.name == "events-sink" and config.kafka["bootstrap.servers"] == "127.0.0.1:9092"
    assert config.catalog.uri == f"sqlite:///{tmp_path}/catalog.db"
    assert config.control.commit_interval.total_seconds() == 120
    assert set(config.tables) == {"shop.orders", "shop.payments"}
    err = capsys.readouterr().err
    assert "keys not carried" in err and "  transforms: Single Message Transforms" in err
    assert yaml.safe_load(out.read_text())["tables"]["shop.orders"]["partition-by"] == [
        "day(ts)",
        "bucket[16](id)",
    ]


def test_a_properties_file_reads_like_connects_standalone(tmp_path: Path) -> None:
    path = tmp_path / "connector.properties"
    path.write_text("# standalone\n" + "".join(f"{k}={v}\n" for k, v in APACHE.items()))
    assert translator.load_connector(path) == APACHE


def test_take_over_needs_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    connector = tmp_path / "c.json"
    connector.write_text(json.dumps(APACHE))
    assert main(["import-connect", str(connector), "--take-over"]) == 2
    assert "--take-over needs --out" in capsys.readouterr().err


PASSWORD = "p@ss:w/rd%1?"
"""A JDBC password with every character a URI's user info cannot hold as it is."""


def _jdbc(uri: str, **more: str) -> dict[str, str]:
    props = {k: v for k, v in APACHE.items() if not k.startswith("iceberg.catalog.jdbc.")}
    return {**props, "iceberg.catalog.uri": uri, **more}


def test_jdbc_credentials_stay_out_of_the_uri_and_the_yaml_and_load_with_any_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The password is a ${VAR} reference beside the URI (Iceberg's jdbc.password), never in the YAML,
    and the catalog gets it whatever characters it holds."""
    from fanout_sink.catalog import load_catalog
    from fanout_sink.config.loading import parse_config

    imported = translator.translate(
        _jdbc(
            "jdbc:postgresql://pg:5432/iceberg",
            **{"iceberg.catalog.jdbc.user": "sink", "iceberg.catalog.jdbc.password": PASSWORD},
        )
    )
    catalog = imported.sink["catalog"]
    assert catalog["uri"] == "postgresql+psycopg2://pg:5432/iceberg"
    assert (catalog["jdbc.user"], catalog["jdbc.password"]) == ("sink", "${ICEBERG_CATALOG_JDBC_PASSWORD}")
    assert imported.variables == {"ICEBERG_CATALOG_JDBC_PASSWORD": "iceberg.catalog.jdbc.password"}
    assert PASSWORD not in imported.yaml() and "ICEBERG_CATALOG_JDBC_PASSWORD" in imported.yaml()
    carried = {"iceberg.catalog.jdbc.user", "iceberg.catalog.jdbc.password", "iceberg.catalog.catalog-impl"}
    assert not carried & set(_reasons(imported))
    monkeypatch.setenv("ICEBERG_CATALOG_JDBC_PASSWORD", PASSWORD)
    config = parse_config(yaml.safe_load(imported.yaml()))
    assert PASSWORD not in repr(config)
    url = load_catalog(config.catalog, create=False).engine.url  # builds the engine, connects to nothing
    assert (url.username, url.password, url.host, url.database) == ("sink", PASSWORD, "pg", "iceberg")


def test_credentials_in_a_jdbc_query_string_are_carried_and_other_parameters_listed() -> None:
    imported = translator.translate(
        _jdbc(f"jdbc:postgresql://pg/iceberg?user=sink&password={PASSWORD}&sslmode=require&loginTimeout=5")
    )
    catalog = imported.sink["catalog"]
    assert catalog["uri"] == "postgresql+psycopg2://pg/iceberg?sslmode=require"
    assert (catalog["jdbc.user"], catalog["jdbc.password"]) == ("sink", "${ICEBERG_CATALOG_JDBC_PASSWORD}")
    assert "loginTimeout" in _reasons(imported)["iceberg.catalog.uri"]
    assert PASSWORD not in imported.yaml() and PASSWORD not in repr(imported.uncarried)


def test_a_jdbc_uri_of_another_database_is_refused_without_repeating_it() -> None:
    with pytest.raises(translator.ImportError_, match=r"^iceberg\.catalog\.uri: .*jdbc:mysql") as err:
        translator.translate(_jdbc(f"jdbc:mysql://db:3306/iceberg?user=sink&password={PASSWORD}"))
    assert PASSWORD not in str(err.value) and "db:3306" not in str(err.value)


def test_connect_config_provider_references_become_variables_or_are_refused() -> None:
    """``${file:...}`` and ``${env:...}`` are resolved by Connect's worker: a value the sink only
    passes on becomes a ${VAR} reference to set, a value the import must read is refused."""
    imported = translator.translate(
        _jdbc(
            "jdbc:postgresql://pg:5432/iceberg",
            **{
                "iceberg.catalog.jdbc.user": "sink",
                "iceberg.catalog.jdbc.password": "${file:/etc/connect/secrets.properties:catalog-password}",
                "iceberg.catalog.s3.endpoint": "${env:S3_ENDPOINT}",
                "iceberg.kafka.sasl.username": "sink",
                "iceberg.kafka.sasl.mechanism": "PLAIN",
                "iceberg.kafka.sasl.password": "${env::KAFKA_PASSWORD}",
            },
        )
    )
    catalog = imported.sink["catalog"]
    assert catalog["jdbc.password"] == "${ICEBERG_CATALOG_JDBC_PASSWORD}"
    assert catalog["s3.endpoint"] == "${S3_ENDPOINT}"
    assert imported.sink["kafka"]["sasl.password"] == "${KAFKA_PASSWORD}"
    assert imported.variables == {
        "ICEBERG_CATALOG_JDBC_PASSWORD": "iceberg.catalog.jdbc.password",
        "S3_ENDPOINT": "iceberg.catalog.s3.endpoint",
        "KAFKA_PASSWORD": "iceberg.kafka.sasl.password",
    }
    assert "${file:" not in imported.yaml()
    for key in ("iceberg.catalog.uri", "topics", "iceberg.control.commit.interval-ms"):
        with pytest.raises(translator.ImportError_, match=rf"^{key}: .*config provider"):
            translator.translate({**APACHE, key: "${file:/etc/connect/c.properties:" + key + "}"})


def test_no_secret_is_printed_or_written_and_each_variable_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = {
        "iceberg.catalog.jdbc.password": PASSWORD,
        "iceberg.kafka.sasl.username": "sink",
        "iceberg.kafka.sasl.mechanism": "PLAIN",
        "iceberg.kafka.sasl.password": "kafka-Secret-1",
        "iceberg.catalog.s3.secret-access-key": "s3-Secret-2",
        "value.converter": "io.confluent.connect.avro.AvroConverter",
        "value.converter.schema.registry.url": "http://registry:8081",
        "value.converter.schema.registry.basic.auth.user.info": "user:registry-Secret-3",
    }
    connector = tmp_path / "connector.json"
    connector.write_text(json.dumps({**APACHE, **secrets}))
    assert main(["import-connect", str(connector)]) == 0
    assert main(["import-connect", str(connector), "--out", str(tmp_path / "sink.yaml")]) == 0
    out, err = capsys.readouterr()
    written = (tmp_path / "sink.yaml").read_text()
    for value in (PASSWORD, "kafka-Secret-1", "s3-Secret-2", "registry-Secret-3"):
        assert value not in out + err + written, value
    for name in ("ICEBERG_CATALOG_JDBC_PASSWORD", "ICEBERG_KAFKA_SASL_PASSWORD",
                 "ICEBERG_CATALOG_S3_SECRET_ACCESS_KEY"):  # fmt: skip
        assert f"${{{name}}}" in written and name in err
    connector.write_text(json.dumps(_jdbc(f"jdbc:oracle:thin:sink/{PASSWORD}@db:1521/iceberg")))
    assert main(["import-connect", str(connector)]) == 2
    assert PASSWORD not in capsys.readouterr().err


def test_a_password_typed_unencoded_in_a_catalog_uri_is_hidden_whole_and_refused_in_one_line() -> None:
    """The URI an import once wrote (the password pasted into it as it was): its redaction hides the
    whole password, not up to its first ``@``, and loading it says what to do in one line instead of
    SQLAlchemy's ValueError quoting the password's tail as a port."""
    from fanout_sink.catalog import CatalogSettings, load_catalog
    from fanout_sink.errors import FanoutSinkError
    from fanout_sink.user_info import redact_url

    uri = f"postgresql+psycopg2://sink:{PASSWORD}@pg:5432/iceberg"
    assert redact_url(uri) == "postgresql+psycopg2://sink:***@pg:5432/iceberg"
    with pytest.raises(FanoutSinkError, match="unencoded '@'") as err:
        load_catalog(CatalogSettings(name="lake", type="sql", uri=uri), create=False)
    assert "w/rd" not in str(err.value) and "ss:" not in str(err.value)


def test_a_config_without_name_takes_the_connectors_name_from_dash_dash_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Connect's bare config object may lack ``name``: ``--name`` gives it (the sink's and the
    connector's, whose groups it names); without either the import says so."""
    props = {k: v for k, v in TABULAR.items() if k not in ("name", "iceberg.control.group-id")}
    imported = translator.translate(props, sink_name="cdc-sink")
    assert (imported.sink["name"], imported.connector) == ("cdc-sink", "cdc-sink")
    assert (imported.connect_group, imported.commit_group) == ("connect-cdc-sink", "cg-control-cdc-sink")
    with pytest.raises(translator.ImportError_, match=r"^name: .*--name"):
        translator.translate(props)
    connector = tmp_path / "connector.json"
    connector.write_text(json.dumps(props))
    assert main(["import-connect", str(connector), "--name", "cdc-sink"]) == 0
    assert "name: cdc-sink" in capsys.readouterr().out


def test_the_keys_not_carried_name_the_connectors_groups_and_no_key_it_carried() -> None:
    """The connector's own groups are read for --take-over only, so they are listed; each key that
    became part of the YAML is not."""
    reasons = _reasons(translator.translate(TABULAR))
    assert "--take-over" in reasons["iceberg.control.group-id"]
    carried = {
        "name", "connector.class", "topics.regex", "iceberg.tables.dynamic-enabled",
        "iceberg.tables.route-field", "iceberg.tables.upsert-mode-enabled", "iceberg.tables.cdc-field",
        "iceberg.tables.default-id-columns", "iceberg.tables.auto-create-enabled", "iceberg.catalog",
        "iceberg.catalog.type", "iceberg.catalog.uri", "iceberg.kafka.bootstrap.servers",
        "consumer.override.auto.offset.reset",
    }  # fmt: skip
    assert not carried & set(reasons)
    groups = {
        "iceberg.connect.group-id": "connect-events", "consumer.override.group.id": "connect-events",
        "iceberg.control.group-id-prefix": "cg-",
    }  # fmt: skip
    reasons = _reasons(translator.translate({**APACHE, **groups}))
    for key in groups:
        assert "--take-over" in reasons[key], key
