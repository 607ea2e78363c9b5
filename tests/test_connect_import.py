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
        "name": "lake", "type": "sql", "uri": "postgresql+psycopg2://sink:secret@pg:5432/iceberg",
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
        "iceberg.control.commit.threads", "iceberg.catalog.catalog-impl", "iceberg.catalog.io-impl",
        "iceberg.catalog.jdbc.password", "iceberg.kafka.sasl.jaas.config", "iceberg.hadoop.fs.s3a.endpoint",
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
