"""``validate``'s table checks on their own (no broker): JSON routes are checked by column names,
evolution settings that let ``run`` cope are not problems, an unloadable table is a problem with its
cause, and the dynamic name template is tried on each source topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.devtools.stack import object_store
from fanout_sink.preflight import Finding
from fanout_sink.validate import check_tables, validate


def _check(catalog: Any, settings: CatalogSettings, tmp_path: Path, **sections: Any) -> list[Finding]:
    sections.setdefault("source", {"topics": ["orders"]})
    config = parse_config(
        {"name": "v", "catalog": settings.model_dump(exclude_none=True), **sections}, base_dir=tmp_path
    )
    return check_tables(config, catalog)


def _problems(findings: list[Finding]) -> list[str]:
    return [f.text for f in findings if f.level == "problem"]


def test_a_json_select_is_checked_by_name_and_evolution_settings_count(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    catalog.create_namespace("a")
    catalog.create_table(
        "a.t",
        Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "note", StringType())),
    )
    strict = {"select": "{ident: id, note: note}"}
    problems = _problems(_check(catalog, catalog_settings, tmp_path, tables={"a.t": strict}))
    assert problems == [
        "tables.\"a.t\".select: gives column 'ident', which table a.t lacks, and "
        'tables."a.t".evolution.add-columns is false: those values would be dropped',
        "tables.\"a.t\": required column 'id' of table a.t never filled by the route: every record would "
        "fail conversion",
    ]
    lenient = {**strict, "evolution": {"add-columns": True, "make-optional": True}}
    findings = _check(catalog, catalog_settings, tmp_path, tables={"a.t": lenient})
    assert _problems(findings) == []
    assert any("route's 2 column(s) fit table a.t (0 with a known type)" in f.text for f in findings)


def test_a_table_that_cannot_be_loaded_is_a_problem(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    catalog.create_namespace("a")
    table = catalog.create_table("a.t", Schema(NestedField(1, "id", LongType())))
    Path(table.metadata_location.removeprefix("file://")).unlink()
    problems = _problems(_check(catalog, catalog_settings, tmp_path, tables={"a.t": {}}))
    assert len(problems) == 1 and "table a.t cannot be loaded from catalog" in problems[0], problems


def test_the_dynamic_name_is_tried_on_each_source_topic(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    findings = _check(
        catalog,
        catalog_settings,
        tmp_path,
        source={"topics": ["keep", "Drop.Me"]},
        dynamic={"table": "join('.', ['raw', topic])", "allow": "^raw\\.keep$"},
    )
    assert [(f.level, f.text) for f in findings] == [
        ("ok", "dynamic.table names records of topic 'keep' raw.keep"),
        (
            "warning",
            "dynamic.table: records of topic 'Drop.Me' get no table: dynamic table name 'raw.Drop.Me' is 2 "
            "namespaces deep; dynamic.max-namespace-depth is 1",
        ),
    ]
    by_field = _check(catalog, catalog_settings, tmp_path, dynamic={"table": "join('.', ['raw', kind])"})
    assert [f.level for f in by_field] == ["ok"] and "reads record fields" in by_field[0].text


def test_a_table_to_create_must_have_its_partition_columns(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    (tmp_path / "t.avsc").write_text(
        '{"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]}'
    )
    tables = {
        "a.inferred": {"select": "{id: id, at: timestamp}", "partition-by": ["day(ts)"]},
        "a.declared": {"schema": "t.avsc", "partition-by": ["bucket[4](id)", "day(at)"]},
        "a.fine": {"select": "{id: id, ts: timestamp}", "partition-by": ["day(ts)"]},
    }
    assert _problems(_check(catalog, catalog_settings, tmp_path, tables=tables)) == [
        "tables.\"a.inferred\".partition-by: day(ts) names column 'ts', which the route does not give: "
        "creating the table would fail",
        'tables."a.declared".partition-by: day(at) names column \'at\', which tables."a.declared".schema '
        "does not give: creating the table would fail",
    ]


def test_values_a_select_computes_from_placeholders_are_not_taken_for_records(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    """``to_string(id)`` of the placeholder gives the text "null", which no long column takes; a
    record's id would give "42", which it does: only the type (text) may count."""
    catalog.create_namespace("a")
    catalog.create_table("a.t", Schema(NestedField(1, "id", LongType())))
    findings = _check(catalog, catalog_settings, tmp_path, tables={"a.t": {"select": "{id: to_string(id)}"}})
    assert _problems(findings) == []


def test_a_change_tables_key_is_checked_against_the_table_or_what_creates_it(
    catalog: Any, catalog_settings: CatalogSettings, tmp_path: Path
) -> None:
    catalog.create_namespace("a")
    catalog.create_table("a.t", Schema(NestedField(1, "id", LongType(), required=True)))
    keyed = Schema(NestedField(1, "id", LongType(), required=True), identifier_field_ids=[1])
    catalog.create_table("a.k", keyed)
    (tmp_path / "k.avsc").write_text(
        '{"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}, '
        '{"name": "score", "type": "double"}]}'
    )
    changes = {"format": "upsert", "key": ["id"]}
    tables = {
        "a.t": {"changes": changes},  # exists without identifier fields
        "a.k": {"changes": changes},  # keyed by id: fine
        "a.new": {"select": "{name: name}", "changes": changes},  # the route lacks the key
        "a.file": {"schema": "k.avsc", "changes": {"format": "upsert", "key": ["score"]}},  # a double
    }
    problems = _problems(_check(catalog, catalog_settings, tmp_path, tables=tables))
    assert problems == [
        "tables.\"a.t\".changes.key: table a.t exists without identifier fields, but its key is ['id'] "
        '(tables."a.t".changes.key)',
        "tables.\"a.new\".changes.key: names column 'id', which the route does not give: no change "
        "could be applied",
        "tables.\"a.file\".changes.key: table a.file: key column 'score' is a double: Iceberg does not "
        "allow floating-point identifier fields",
    ]


def test_offline_contacts_nothing_and_still_checks_the_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker/sink.yaml names hosts (kafka, rest, s3) that only resolve inside its compose network:
    offline, it is valid with nothing contacted, while a route that cannot create its table is still a
    problem and a table that must exist already is not looked up."""
    for name in (object_store.ENDPOINT_ENV, object_store.ACCESS_KEY_ENV, object_store.SECRET_KEY_ENV):
        monkeypatch.setenv(name, "build")
    monkeypatch.setattr(
        "fanout_sink.validate.Preflight", lambda *a, **k: pytest.fail("offline validate ran a preflight")
    )
    example = validate(Path(__file__).resolve().parents[1] / "docker" / "sink.yaml", offline=True)
    assert example.ok, example.lines()
    # Offline, whether a table exists is unknown: no line may say that one does not (issue 49).
    assert not [f.text for f in example.findings if "does not exist yet" in f.text]
    assert [f.text for f in example.findings if "not looked up offline" in f.text] == [
        "table shop.orders: not looked up offline; if it does not exist, run creates it from "
        "../schemas/tables/shop_orders.avsc",
        "table shop.payments: not looked up offline; if it does not exist, run creates it from its "
        "first rows",
        "table shop.clicks: not looked up offline; if it does not exist, run creates it from its first rows",
    ]
    out, _ = example.lines()
    assert out[-1] == (
        "valid offline: nothing in the config or the routes stops this sink; the broker, the catalog "
        "and its tables were not checked (validate without --offline where they are reachable)"
    )
    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "off",
                "source": {"topics": ["orders"]},
                "catalog": {"type": "rest", "uri": "http://unreachable.invalid:1/iceberg"},
                "tables": {
                    "a.t": {"select": "{id: id}", "partition-by": ["day(ts)"]},
                    "a.kept": {"auto-create": False},
                },
            }
        )
    )
    report = validate(config, offline=True)
    assert _problems(report.findings) == [
        "tables.\"a.t\".partition-by: day(ts) names column 'ts', which the route does not give: creating "
        "the table would fail"
    ]
    assert "table a.kept: not looked up offline; run needs it to exist" in [f.text for f in report.findings]
