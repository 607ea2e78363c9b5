"""``fanout-sink route --sample FILE``: each record's table and row, filter or dead letter with its
reason, each table's columns, through the workers' own processor, with nothing written (no broker)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from fanout_sink import cli
from fanout_sink.catalog import CatalogSettings

SAMPLE = [
    {"kind": "order", "id": 1, "amount": 12.5},
    {"kind": "order", "id": 2, "amount": "lots"},  # no double: a dead letter (convert)
    {"kind": "order", "id": 3, "amount": 4.0, "note": "gift"},  # a new column of an existing table
    {"kind": "payment", "id": 9, "method": "card"},  # a table created from its first rows
    {"value": None, "key": "7"},  # a tombstone: filtered (source.tombstones: skip)
    {"kind": "refund", "id": 4},  # no route: filtered (unmatched.action: drop)
    {"value-base64": base64.b64encode(b"{not json").decode()},  # not JSON: a dead letter (decode)
]


def _sink(tmp_path: Path, settings: CatalogSettings, **extra: Any) -> Path:
    config = {
        "name": "shop",
        "kafka": {"bootstrap.servers": "127.0.0.1:1"},  # never contacted by --sample
        "source": {"topics": ["events"]},
        "catalog": settings.model_dump(exclude_none=True),
        "tables": {
            "shop.orders": {"when": "kind == 'order'", "evolution": {"add-columns": True}},
            "shop.payments": {"when": "kind == 'payment'", "select": "{id: id, method: method}"},
        },
        "unmatched": {"action": "drop"},
        **extra,
    }
    path = tmp_path / "sink.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.jsonl"
    lines = [json.dumps(item) for item in SAMPLE]
    path.write_text("\n".join(lines) + "\n")
    return path


def _orders(catalog: Any) -> Any:
    catalog.create_namespace("shop")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "amount", DoubleType()),
        NestedField(3, "kind", StringType()),
    )
    return catalog.create_table("shop.orders", schema)


def test_route_shows_rows_filters_and_dead_letters_and_writes_nothing(
    tmp_path: Path, catalog: Any, catalog_settings: CatalogSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _orders(catalog).metadata_location
    config = _sink(tmp_path, catalog_settings, **{"dead-letter": {"topic": "shop-dlq"}})
    code = cli.main(["route", "--config", str(config), "--sample", str(_sample(tmp_path))])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert "table shop.orders (exists; would evolve: add note): 2 row(s), 1 dead letter(s)" in lines
    assert "  + note: string" in lines
    assert "    id: long (required)" in lines
    assert "table shop.payments (would be created): 1 row(s)" in lines
    assert "    id: long" in lines and "    method: string" in lines
    assert 'events[0]@0 -> shop.orders {"id": 1, "amount": 12.5, "kind": "order", "note": null}' in lines
    assert any(
        line.startswith("events[0]@1 dead letter to shop-dlq (convert, table shop.orders, column amount): ")
        and "'lots'" in line
        for line in lines
    ), out
    assert 'events[0]@3 -> shop.payments {"id": 9, "method": "card"}' in lines
    assert "events[0]@4 filtered: tombstone (null value): source.tombstones is skip" in lines
    assert "events[0]@5 filtered: no table matched the record (unmatched.action is drop)" in lines
    assert any(line.startswith("events[0]@6 dead letter to shop-dlq (decode): ") for line in lines), out
    assert "7 record(s): 3 row(s), 0 delete(s), 0 superseded, 2 dead letter(s), 2 filtered" in out
    # Nothing written: the existing table kept its metadata, the new one was not created.
    assert catalog.load_table("shop.orders").metadata_location == before
    assert catalog.list_tables("shop") == [("shop", "orders")]

    capsys.readouterr()
    code = cli.main(
        ["route", "--config", str(config), "--sample", str(_sample(tmp_path)), "--format", "json"]
    )
    found = json.loads(capsys.readouterr().out)
    assert code == 0
    tables = {t["name"]: t for t in found["tables"]}
    assert tables["shop.orders"]["added"] == ["note"] and not tables["shop.orders"]["created"]
    assert tables["shop.payments"]["created"] and tables["shop.payments"]["rows"] == 1
    assert found["records"][0]["outcomes"] == [
        {
            "kind": "row",
            "table": "shop.orders",
            "row": {"id": 1, "amount": 12.5, "kind": "order", "note": None},
        }
    ]
    assert found["records"][1]["outcomes"][0]["stage"] == "convert"


def test_route_marks_the_record_a_run_without_dead_letters_stops_at(
    tmp_path: Path, catalog_settings: CatalogSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _sink(tmp_path, catalog_settings)  # no dead-letter topic: errors.tolerance is none
    catalog_file = Path(catalog_settings.uri.removeprefix("sqlite:///"))  # type: ignore[union-attr]
    assert not catalog_file.exists()
    code = cli.main(["route", "--config", str(config), "--sample", str(_sample(tmp_path))])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "does not exist yet, so every table would be created" in out
    assert "table shop.orders (would be created): 3 row(s)" in out  # created from the first rows
    assert any(
        line.startswith("events[0]@6 STOPS THE SINK (decode; errors.tolerance is none)")
        for line in out.splitlines()
    )
    assert "a run would stop at events[0]@6 (errors.tolerance is none; 1 record(s) would stop it)" in out
    assert not catalog_file.exists()  # a preview makes no catalog


def test_a_sample_line_that_is_not_a_record_is_one_line_naming_it(
    tmp_path: Path, catalog_settings: CatalogSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "bad.jsonl"
    sample.write_text('{"id": 1}\n{"value": 1, "offset": -5}\n')
    code = cli.main(["route", "--config", str(_sink(tmp_path, catalog_settings)), "--sample", str(sample)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        f"fanout-sink: --sample {sample} line 2: offset -5 must be an integer above the partition's last"
    )


def test_route_of_a_change_table_shows_each_keys_last_change_and_the_superseded(
    tmp_path: Path, catalog_settings: CatalogSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "crm",
                "source": {"topics": ["accounts"]},
                "catalog": catalog_settings.model_dump(exclude_none=True),
                "tables": {
                    "crm.accounts": {
                        "changes": {"format": "upsert", "key": ["id"], "delete-when": "status == 'closed'"}
                    }
                },
            }
        )
    )
    sample = tmp_path / "changes.jsonl"
    changes = [
        {"id": 1, "status": "open"},
        {"id": 2, "status": "open"},
        {"id": 1, "status": "frozen"},
        {"id": 2, "status": "closed"},
    ]
    sample.write_text("\n".join(json.dumps(c) for c in changes))
    code = cli.main(["route", "--config", str(config), "--sample", str(sample)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "table crm.accounts (would be created): 1 row(s), 1 deleted key(s)" in lines
    assert "    id: long (required)" in lines  # a key column is required
    reason = "superseded (a later change of the same key in the slice wins)"
    assert [line for line in lines if line.startswith("accounts[0]@")] == [
        f"accounts[0]@0 -> crm.accounts: {reason}",
        f"accounts[0]@1 -> crm.accounts: {reason}",
        'accounts[0]@2 -> crm.accounts {"id": 1, "status": "frozen"}',
        "accounts[0]@3 -> crm.accounts: deletes its key",
    ]


def test_a_catalog_that_does_not_answer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    down = CatalogSettings(name="lake", type="rest", uri="http://127.0.0.1:1")
    config = _sink(tmp_path, down)
    sample = tmp_path / "one.jsonl"
    sample.write_text('{"kind": "order", "id": 1}\n')
    code = cli.main(["route", "--config", str(config), "--sample", str(sample)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith(
        "fanout-sink: catalog 'lake' is not reachable: cannot connect to http://127.0.0.1:1"
    ), captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
