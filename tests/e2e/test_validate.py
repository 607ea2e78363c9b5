"""``fanout-sink validate`` reports every reason ``run`` would not start, and tables that do not fit
their routes, one cause line + one fix line each, exit 2; a good config gives exit 0 and a summary.
Nothing is created: the broker's topics, the catalog's tables, the catalog file and the warehouse
folder are compared before and after.

Real: the CLI in a child process, the shared broker, an embedded SQLite catalog with tables made by
PyIceberg, a closed port for an unreachable broker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from chaos.app_process import child_env
from confluent_kafka.admin import AdminClient
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import BooleanType, LongType, NestedField, StringType, TimestamptzType

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.broker import free_port


def _validate(tmp_path: Path, *, json_output: bool = False, **sections: Any) -> tuple[int, str, list[str]]:
    """Validate a config; its exit code, stdout and stderr lines."""
    config = tmp_path / "sink.yaml"
    sections.setdefault("name", f"val{uuid.uuid4().hex[:6]}")
    config.write_text(yaml.safe_dump(sections))
    command = [sys.executable, "-m", "fanout_sink.cli", "validate", "--config", str(config)]
    done = subprocess.run(
        command + (["--json"] if json_output else []),
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr.strip().splitlines()


def _problems(code: int, lines: list[str]) -> list[str]:
    """The cause lines (warnings too), after checking the output is nothing but cause + fix pairs."""
    text = "\n".join(lines)
    assert code == 2, text
    assert "Traceback" not in text and "%3|" not in text and "%4|" not in text, text
    assert len(lines) % 2 == 0, text
    causes, fixes = lines[0::2], lines[1::2]
    assert all(c.startswith("fanout-sink: ") for c in causes), text
    assert all(f.startswith("  fix: ") and len(f) > len("  fix: ") for f in fixes), text
    return causes


def _catalog_section(settings: CatalogSettings) -> dict[str, Any]:
    return settings.model_dump(exclude_none=True)


def test_a_good_config_passes_and_creates_nothing(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    source = make_topic("src")
    before = set(admin.list_topics(timeout=30).topics)
    settings = CatalogSettings(
        uri=f"sqlite:///{tmp_path / 'cat' / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}"
    )
    code, out, err = _validate(
        tmp_path,
        kafka={"bootstrap.servers": bootstrap_servers},
        source={"topics": [source]},
        catalog=_catalog_section(settings),
        tables={"shop.orders": {"select": "{id: id, ts: timestamp}", "partition-by": ["day(ts)"]}},
        dynamic={"table": "join('.', ['raw', topic])"},
        **{"dead-letter": {"topic": f"dlq-{uuid.uuid4().hex[:6]}"}},
    )
    assert code == 0, "\n".join(err)
    assert err == []
    assert out.strip().splitlines()[-1].startswith("valid: ")
    for checked in ("Kafka at", "source.topics exist", "control.topic", "dead-letter.topic", "warehouse"):
        assert checked in out, out
    assert f"raw.{source.replace('-', '_')}" in out
    assert set(admin.list_topics(timeout=30).topics) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sink.yaml"]  # no catalog file, no warehouse


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path, bootstrap_servers: str) -> None:
    """A missing source topic, a catalog without a URI, an unwritable warehouse: all three at once."""
    (tmp_path / "a-file").write_text("not a folder")
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    code, _, err = _validate(
        tmp_path,
        kafka={"bootstrap.servers": bootstrap_servers},
        source={"topics": [missing]},
        catalog={"warehouse": f"file://{tmp_path / 'a-file' / 'wh'}"},
        tables={"a.b": {}},
    )
    causes = _problems(code, err)
    assert len(causes) == 3, err
    assert "source.topics" in causes[0] and missing in causes[0]
    assert "catalog.warehouse" in causes[1]
    assert "catalog.uri is not set" in causes[2]


def test_an_unreachable_broker_is_one_problem_and_the_catalog_is_still_checked(tmp_path: Path) -> None:
    servers = f"127.0.0.1:{free_port()}"
    code, _, err = _validate(
        tmp_path,
        kafka={"bootstrap.servers": servers},
        source={"topics": ["orders"]},
        catalog={"warehouse": str(tmp_path / "wh")},
        tables={"a.b": {}},
    )
    causes = _problems(code, err)
    assert len(causes) == 2, err
    assert "unreachable" in causes[0] and servers in causes[0]
    assert "catalog.uri" in causes[1]


def test_a_config_error_names_the_yaml_key(tmp_path: Path) -> None:
    code, _, err = _validate(
        tmp_path, source={"topics": ["orders"]}, tables={"a.b": {"partition-by": ["dayz(ts)"]}}
    )
    causes = _problems(code, err)
    assert causes == ["fanout-sink: sink.yaml: tables.\"a.b\".partition-by[0]: unknown transform 'dayz(ts)'"]
    assert err[1].startswith("  fix: use one of identity, bucket")


def test_tables_that_do_not_fit_their_routes(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    """Existing tables against routes whose types the source's Avro schema declares: a missing table
    under auto-create false, a select column the table lacks, a required column never filled, a
    type no value converts to (errors) and a partition spec other than partition-by (a warning)."""
    settings = CatalogSettings(
        uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}"
    )
    catalog = load_catalog(settings)
    catalog.create_namespace("shop")
    orders = catalog.create_table(
        "shop.orders",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "paid", TimestamptzType(), required=False),  # the record's `paid` is a boolean
            NestedField(3, "region", StringType(), required=True),  # no route fills it
            NestedField(4, "ts", TimestamptzType(), required=False),
        ),
    )
    with orders.update_spec() as spec:
        spec.add_field("ts", DayTransform(), "ts_day")
    catalog.create_table("shop.flags", Schema(NestedField(1, "flag", BooleanType(), required=False)))
    schema = tmp_path / "order.avsc"
    schema.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "Order",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "paid", "type": "boolean"},
                    {"name": "note", "type": "string"},
                ],
            }
        )
    )
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    source = make_topic("orders")
    topics_before = set(admin.list_topics(timeout=30).topics)
    tables_before = sorted(catalog.list_tables("shop"))
    files_before = sorted(p for p in tmp_path.rglob("*") if p.name != "sink.yaml")
    code, _, err = _validate(
        tmp_path,
        kafka={"bootstrap.servers": bootstrap_servers},
        source={"topics": [source], "format": "avro", "schema": str(schema)},
        catalog=_catalog_section(settings),
        tables={
            "shop.orders": {"select": "{id: id, paid: paid, ts: timestamp}", "partition-by": ["hour(ts)"]},
            "shop.flags": {"select": "{flag: paid, note: note}"},
            "shop.missing": {"auto-create": False},
        },
    )
    causes = [c for c in _problems(code, err) if not c.startswith("fanout-sink: warning: ")]
    assert any(
        "tables.\"shop.orders\": column 'paid' is timestamp[us, tz=UTC] in table shop.orders, but the route "
        "gives it bool values" in c
        for c in causes
    ), err
    assert any("tables.\"shop.orders\": required column 'region'" in c for c in causes), err
    assert any("tables.\"shop.flags\".select: gives column 'note'" in c for c in causes), err
    assert any("table shop.missing does not exist" in c and "auto-create is false" in c for c in causes), err
    assert len(causes) == 4, err
    warning = next(line for line in err if "warning:" in line)
    assert "partition-by: is hour(ts) but table shop.orders is partitioned by day(ts)" in warning
    assert set(admin.list_topics(timeout=30).topics) == topics_before
    assert sorted(catalog.list_tables("shop")) == tables_before
    assert sorted(p for p in tmp_path.rglob("*") if p.name != "sink.yaml") == files_before


def test_a_declared_schema_is_checked_before_its_table_exists(
    tmp_path: Path, bootstrap_servers: str, make_topic: Callable[..., str]
) -> None:
    (tmp_path / "t.avsc").write_text(
        json.dumps({"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]})
    )
    code, out, err = _validate(
        tmp_path,
        json_output=True,
        kafka={"bootstrap.servers": bootstrap_servers},
        source={"topics": [make_topic("src")]},
        catalog=_catalog_section(
            CatalogSettings(uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=str(tmp_path / "w"))
        ),
        tables={"a.t": {"schema": "t.avsc", "select": "{key: key}"}},
    )
    assert code == 2, err
    report = json.loads(out)
    problems = [f["text"] for f in report["findings"] if f["level"] == "problem"]
    assert report["ok"] is False
    assert problems == [
        'tables."a.t".select: gives column \'key\', which tables."a.t".schema lacks, and '
        'tables."a.t".evolution.add-columns is false: those values would be dropped',
        'tables."a.t": required column \'id\' of tables."a.t".schema never filled by the route: every '
        "record would fail conversion",
    ]
