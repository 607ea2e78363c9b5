"""The slice processor end to end: counts reconcile (I5), tolerance, both evaluation paths agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import RecordError
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import build_processor
from fanout_sink.transform.records import RoutedSlice

REPO = Path(__file__).resolve().parents[2]


def _config(catalog_settings: CatalogSettings, **overrides: Any) -> SinkConfig:
    data: dict[str, Any] = {
        "name": "shop",
        "source": {"topics": ["events"], "tombstones": "skip"},
        "catalog": catalog_settings.model_dump(),
        "tables": {
            "analytics.orders": {
                "when": "type == 'order'",
                "schema": "schemas/tables/orders.avsc",
                "conversion": {"name-mapping": {"total": ["amount"]}},
            },
            "analytics.big": {"when": "amount > `100`", "select": "{id: id, amount: amount}"},
        },
        "dynamic": {"table": "join('.', ['raw', kind])", "allow": r"^raw\.[a-z0-9_]+$", "auto-create": True},
        "dead-letter": {"topic": "dlq"},
    }
    data.update(overrides)
    return parse_config(data, "test", base_dir=REPO)


_kinds = st.sampled_from(["click", "view", "Sign-Up", "../etc", "a.b", "x\x00y", None])
_record = st.one_of(
    st.builds(
        lambda i, amount, ts: {"type": "order", "id": i, "amount": amount, "ts": ts},
        st.one_of(st.integers(0, 10**6), st.just("not-a-number")),
        st.one_of(st.integers(0, 500), st.floats(0, 500, allow_nan=False)),
        st.sampled_from(["2024-05-01T10:00:00Z", "2024-05-01", 1714557600000, None, "garbage"]),
    ),
    st.builds(lambda a, k: {"type": "payment", "id": 1, "amount": a, "kind": k}, st.integers(0, 500), _kinds),
    st.builds(lambda k: {"type": "event", "kind": k} if k is not None else {"type": "event"}, _kinds),
    st.sampled_from([b"{not json", b"[1]", None]),
)


def _expected_extra(record: Any) -> int:
    if not isinstance(record, dict):
        return 0
    routes = int(record.get("type") == "order")
    amount = record.get("amount")
    routes += int(isinstance(amount, int | float) and amount > 100)
    return max(routes - 1, 0)


def _encode(record: Any) -> bytes | None:
    return record if record is None or isinstance(record, bytes) else json.dumps(record).encode()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    records=st.lists(_record, min_size=1, max_size=30),
    unmatched=st.sampled_from(["drop", "dead-letter"]),
    tombstones=st.sampled_from(["skip", "dead-letter"]),
)
def test_counts_reconcile(
    catalog_settings: CatalogSettings, records: list[Any], unmatched: str, tombstones: str
) -> None:
    """I5: records in + extra routes = rows in tables + dead letters + filtered."""
    config = _config(
        catalog_settings,
        unmatched={"action": unmatched},
        source={"topics": ["events"], "tombstones": tombstones},
    )
    process = build_processor(config, load_catalog(catalog_settings))
    out = process(make_raw_slice([_encode(r) for r in records]))
    rows = sum(t.rows.num_rows for t in out.tables.values())
    extra = sum(_expected_extra(r) for r in records)
    assert rows + len(out.dead_letters) + out.filtered == len(records) + extra
    stats = process.last_stats
    assert stats.reconciles() and stats.extra_routes == extra
    if unmatched == "dead-letter" and tombstones == "dead-letter":
        assert out.filtered == 0
    for letter in out.dead_letters:
        assert deadletter.header(letter, deadletter.STAGE) in deadletter.STAGES
        assert deadletter.header(letter, deadletter.REASON)
    for name, table_rows in out.tables.items():
        assert table_rows.rows.schema.equals(table_rows.table.schema().as_arrow(), check_metadata=True), name
    created = {".".join(ident) for ns in ("raw",) for ident in _tables(process, ns)}
    assert all(n in {"raw.click", "raw.view", "raw.sign_up"} for n in created)


def _tables(process: Any, namespace: str) -> list[tuple[str, ...]]:
    catalog = process.tables.catalog
    if (namespace,) not in catalog.list_namespaces():
        return []
    return list(catalog.list_tables(namespace))


def _summary(out: RoutedSlice) -> tuple[Any, ...]:
    tables = {name: rows.rows.to_pylist() for name, rows in sorted(out.tables.items())}
    letters = [(d.key, d.value, d.headers) for d in out.dead_letters]
    return tables, letters, out.filtered


def test_vectorised_and_per_record_processors_agree(catalog_settings: CatalogSettings, catalog: Any) -> None:
    records = [
        {"type": "order", "id": 1, "amount": 250.5, "ts": "2024-05-01T10:00:00Z", "customer": "c"},
        {"type": "order", "id": "x", "amount": 5, "ts": "2024-05-01"},
        {"type": "payment", "id": 2, "amount": 50, "kind": "click"},
        {"type": "event", "kind": "Sign-Up"},
        {"type": "event", "kind": "../etc"},
        {"type": "event"},
        b"oops",
        None,
    ]
    config = _config(catalog_settings)
    slice_ = make_raw_slice([_encode(r) for r in records], keys=[b"k"] * len(records))
    fast = build_processor(config, catalog)
    slow = build_processor(config, catalog, vectorised=False)
    first = fast(slice_)
    assert fast.router.rules["analytics.orders"].last_vectorised  # type: ignore[union-attr]
    assert fast.router.dynamic is not None and fast.router.dynamic.last_vectorised
    second = slow(slice_)
    assert not slow.router.rules["analytics.orders"].last_vectorised  # type: ignore[union-attr]
    assert _summary(first) == _summary(second)
    assert set(first.tables) == {"analytics.orders", "analytics.big", "raw.click", "raw.sign_up"}


def test_tolerance_none_raises_with_coordinates(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(catalog_settings, **{"errors": {"tolerance": "none"}})
    process = build_processor(config, catalog)
    good = {"type": "order", "id": 1, "ts": "2024-05-01T10:00:00Z"}
    slice_ = make_raw_slice(
        [_encode(good), b"{bad", _encode(good)], topic="events", partition=4, start_offset=40
    )
    with pytest.raises(RecordError) as info:
        process(slice_)
    error = info.value
    assert (error.topic, error.partition, error.offset, error.stage) == ("events", 4, 41, "decode")
    assert "events[4]@41" in str(error) and "invalid JSON" in str(error)
    assert "errors.tolerance: all" in str(error)
    process(make_raw_slice([_encode(good)], topic="events"))  # good records pass
    with pytest.raises(
        RecordError, match=r"events\[0\]@0 failed at convert: column 'id'.*\(table analytics.orders\)"
    ):
        process(make_raw_slice([_encode({**good, "id": "x"})], topic="events"))


def test_tolerance_none_still_dead_letters_by_policy(catalog_settings: CatalogSettings, catalog: Any) -> None:
    """Tombstones and unmatched records are dead-lettered by configuration, not errors."""
    config = _config(
        catalog_settings,
        source={"topics": ["events"], "tombstones": "dead-letter"},
        unmatched={"action": "dead-letter"},
        dynamic=None,
        errors={"tolerance": "none"},
    )
    out = build_processor(config, catalog)(make_raw_slice([None, _encode({"type": "other"})]))
    stages = [deadletter.header(d, deadletter.STAGE) for d in out.dead_letters]
    assert stages == ["tombstone", "route"]


def test_avro_source(catalog_settings: CatalogSettings, catalog: Any, tmp_path: Path) -> None:
    import io

    import fastavro

    schema = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "type", "type": "string"},
            {"name": "id", "type": "long"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        ],
    }
    (tmp_path / "event.avsc").write_text(json.dumps(schema))
    config = _config(
        catalog_settings,
        source={"topics": ["events"], "format": "avro", "schema": str(tmp_path / "event.avsc")},
        dynamic=None,
    )
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), {"type": "order", "id": 5, "ts": 0})
    out = build_processor(config, catalog)(make_raw_slice([buffer.getvalue(), b"\xff"]))
    assert out.tables["analytics.orders"].rows.column("id").to_pylist() == [5]
    assert [deadletter.header(d, deadletter.STAGE) for d in out.dead_letters] == ["decode"]


def test_convert_failure_in_one_table_keeps_the_other_route(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """A record routed to two tables that fails in one: one row plus one dead letter."""
    config = _config(catalog_settings)
    process = build_processor(config, catalog)
    record = {"type": "order", "id": 7, "amount": 500, "ts": "never"}
    out = process(make_raw_slice([_encode(record)]))
    assert "analytics.orders" not in out.tables
    assert out.tables["analytics.big"].rows.to_pylist() == [{"id": 7, "amount": 500}]
    (letter,) = out.dead_letters
    assert deadletter.header(letter, deadletter.TABLE) == "analytics.orders"
    assert deadletter.header(letter, deadletter.COLUMN) == "ts"
    assert process.last_stats.reconciles() and process.last_stats.extra_routes == 1


@pytest.mark.parametrize("vectorised", [True, False])
def test_a_when_that_raises_on_a_record_dead_letters_it_instead_of_reading_as_no_match(
    catalog_settings: CatalogSettings, catalog: Any, vectorised: bool
) -> None:
    """Issue 47 item 5: a ``when`` that raised on a record (``starts_with`` of a missing field) read as
    "false": the record silently left the table. It is a bad record now, dead-lettered for that table
    with the expression and jmespath's reason, while its other routes still take it; under tolerance
    ``none`` it stops the slice naming topic[partition]@offset."""
    tables = {"analytics.codes": {"when": "starts_with(code, 'A')"}, "analytics.every": {}}
    config = _config(catalog_settings, tables=tables, dynamic=None)
    records = [{"code": "A1"}, {"other": 1}, {"code": "B2"}]
    slice_ = make_raw_slice([_encode(r) for r in records], topic="events", partition=2, start_offset=10)
    process = build_processor(config, catalog, vectorised=vectorised)
    out = process(slice_)
    assert process.router.rules["analytics.codes"].last_vectorised == vectorised  # type: ignore[union-attr]
    assert out.tables["analytics.codes"].rows.column("code").to_pylist() == ["A1"]
    assert out.tables["analytics.every"].rows.num_rows == 3
    (letter,) = out.dead_letters
    assert deadletter.header(letter, deadletter.STAGE) == "route"
    assert deadletter.header(letter, deadletter.TABLE) == "analytics.codes"
    assert deadletter.header(letter, deadletter.SOURCE_OFFSET) == "11"
    reason = deadletter.header(letter, deadletter.REASON) or ""
    assert reason.startswith("when \"starts_with(code, 'A')\" failed: ") and "invalid type" in reason, reason
    assert out.filtered == 0 and process.last_stats.reconciles() and process.last_stats.extra_routes == 2
    strict = build_processor(
        _config(catalog_settings, tables=tables, dynamic=None, errors={"tolerance": "none"}), catalog
    )
    with pytest.raises(
        RecordError, match=r"events\[2\]@11 failed at route: when .*\(table analytics.codes\)"
    ):
        strict(slice_)


def test_empty_slice(catalog_settings: CatalogSettings, catalog: Any) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    out = process(make_raw_slice([]))
    assert out.tables == {} and out.dead_letters == [] and out.filtered == 0


def test_rows_match_table_schema_after_evolution(catalog_settings: CatalogSettings, catalog: Any) -> None:
    config = _config(
        catalog_settings,
        tables={"analytics.events": {"evolution": True}},
        dynamic=None,
    )
    process = build_processor(config, catalog)
    process(make_raw_slice([_encode({"id": 1})]))
    out = process(make_raw_slice([_encode({"id": 2, "new": {"a": 1}})]))
    rows = out.tables["analytics.events"]
    assert rows.rows.schema.equals(rows.table.schema().as_arrow(), check_metadata=True)
    assert rows.rows.to_pylist() == [{"id": 2, "new": {"a": 1}}]
    assert isinstance(rows.rows, pa.Table)


def test_dynamic_table_without_auto_create_is_dead_lettered(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    config = _config(
        catalog_settings,
        dynamic={"table": "join('.', ['raw', kind])", "allow": r"^raw\.[a-z]+$", "auto-create": False},
    )
    process = build_processor(config, catalog)
    out = process(make_raw_slice([_encode({"type": "event", "kind": "click"})]))
    (letter,) = out.dead_letters
    assert "auto-create is off" in (deadletter.header(letter, deadletter.REASON) or "")
    assert deadletter.header(letter, deadletter.TABLE) == "raw.click"
    catalog.create_namespace("raw")
    catalog.create_table("raw.click", schema=pa.schema([pa.field("kind", pa.string())]))
    out = process(make_raw_slice([_encode({"type": "event", "kind": "click"})]))
    # dynamic tables evolve by default: the record's other field is added
    assert out.tables["raw.click"].rows.to_pylist() == [{"kind": "click", "type": "event"}]


def test_null_only_columns_wait_for_a_value(catalog_settings: CatalogSettings, catalog: Any) -> None:
    """With add-columns on, a column null in the first batch is added later with its real type."""
    config = _config(catalog_settings, tables={"analytics.events": {"evolution": True}}, dynamic=None)
    process = build_processor(config, catalog)
    process(make_raw_slice([_encode({"id": 1, "score": None})]))
    out = process(make_raw_slice([_encode({"id": 2, "score": 7})]))
    table = out.tables["analytics.events"].table
    assert str(table.schema().find_field("score").field_type) == "long"


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=st.lists(_record, min_size=1, max_size=20))
def test_both_paths_agree_on_random_slices(catalog_settings: CatalogSettings, records: list[Any]) -> None:
    config = _config(catalog_settings)
    catalog = load_catalog(catalog_settings)
    slice_ = make_raw_slice([_encode(r) for r in records])
    fast = build_processor(config, catalog)(slice_)
    slow = build_processor(config, catalog, vectorised=False)(slice_)
    assert _summary(fast) == _summary(slow)


def test_bad_neighbour_does_not_decide_a_dynamic_tables_column_type(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """An order's string ``id`` makes the batch's ``id`` column JSON text (lossy); the clicks routed
    to a new dynamic table in the same batch must still create it with ``id`` as a long."""
    process = build_processor(_config(catalog_settings), catalog)
    records = [{"type": "event", "kind": "click", "id": 1}, {"type": "order", "id": "x", "ts": "2024-05-01"}]
    out = process(make_raw_slice([_encode(r) for r in records]))
    clicks = out.tables["raw.click"]
    assert clicks.rows.column("id").to_pylist() == [1]
    assert str(clicks.table.schema().find_field("id").field_type) == "long"


def test_a_fan_out_slice_converts_each_tables_schema_to_arrow_once_per_schema(
    catalog_settings: CatalogSettings, catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each table's rows are checked (evolve) and converted against its schema in Arrow on every
    chunk; with 500 tables of ~100 rows per 50,000-record chunk, PyIceberg's conversion, made anew on
    each call, was a quarter of routing (issue 34). Counted, not timed: the second slice over the same
    tables converts nothing, and a table whose schema evolves is converted once more."""
    config = _config(catalog_settings, tables={})
    process = build_processor(config, catalog)
    kinds = [f"k{n}" for n in range(12)]
    records = [_encode({"type": "event", "kind": kind, "n": n}) for n in range(3) for kind in kinds]
    process(make_raw_slice(records))  # creates the tables
    conversions: list[int] = []
    as_arrow = Schema.as_arrow
    monkeypatch.setattr(Schema, "as_arrow", lambda self: conversions.append(1) or as_arrow(self))

    out = process(make_raw_slice(records))
    assert sorted(out.tables) == sorted(f"raw.{kind}" for kind in kinds)
    assert len(conversions) == 0, "the same tables and schemas as the first slice: nothing to convert"

    out = process(make_raw_slice([_encode({"type": "event", "kind": "k0", "n": 4, "extra": "x"})]))
    assert out.tables["raw.k0"].rows.to_pylist() == [{"kind": "k0", "n": 4, "type": "event", "extra": "x"}]
    assert out.tables["raw.k0"].rows.schema.equals(out.tables["raw.k0"].table.schema().as_arrow())
    assert len(conversions) == 2, "the evolved schema converted once (and once by this test's own check)"
