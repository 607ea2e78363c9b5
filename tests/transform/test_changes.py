"""Change tables (``changes:``) through the slice processor: upsert and Debezium records become each
key's last change, deletes, dead letters or filtered records, and the counts still reconcile (I5)."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.common import embedded_catalog_settings
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import ConfigError, RecordError, TableError
from fanout_sink.transform import deadletter
from fanout_sink.transform.changes import last_change_wins
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.records import RoutedSlice

TOPIC, PARTITION, START = "dbserver.crm.customers", 3, 100


def _config(catalog_settings: CatalogSettings, dead_letter: bool = True, **tables: Any) -> SinkConfig:
    data: dict[str, Any] = {
        "name": "cdc",
        "source": {"topics": [TOPIC]},
        "catalog": catalog_settings.model_dump(),
        "tables": tables
        or {
            "crm.customers": {
                "when": "source.table == 'customers'",
                "changes": {"format": "debezium", "key": ["id"]},
            },
            "crm.accounts": {
                "when": "kind == 'account'",
                "select": "{id: id, owner: owner, balance: balance, status: status}",
                "changes": {"format": "upsert", "key": ["id"], "delete-when": "status == 'closed'"},
            },
        },
    }
    if dead_letter:
        data["dead-letter"] = {"topic": "cdc-dlq"}
    return parse_config(data, "sink.yaml")


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    source = {"connector": "postgresql", "db": "crm", "table": "customers", "lsn": 1}
    return {"op": op, "before": before, "after": after, "source": source, "ts_ms": 1_700_000_000_000}


def _run(process: RoutingProcessor, records: list[Any]) -> RoutedSlice:
    values = [None if r is None else r if isinstance(r, bytes) else json.dumps(r).encode() for r in records]
    out = process(make_raw_slice(values, topic=TOPIC, partition=PARTITION, start_offset=START))
    assert process.last_stats.reconciles(), process.last_stats
    return out


def _offsets(out: RoutedSlice) -> list[int]:
    return [int(dict(d.headers)[deadletter.SOURCE_OFFSET]) for d in out.dead_letters]


def test_debezium_events_become_each_keys_last_change(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    out = _run(
        process,
        [
            _event("r", None, {"id": 1, "name": "ann"}),  # snapshot read
            _event("c", None, {"id": 2, "name": "bob"}),
            _event("u", {"id": 1, "name": "ann"}, {"id": 1, "name": "anne"}),
            _event("d", {"id": 2, "name": "bob"}, None),
            _event("d", {"id": 3, "name": "cy"}, None),  # a delete of a key this slice never saw
            _event("c", None, {"id": 4, "name": "dee"}),
            _event("d", {"id": 4, "name": "dee"}, None),
            _event("c", None, {"id": 4, "name": "dee again"}),  # re-inserted after its delete
        ],
    )
    customers = out.tables["crm.customers"]
    assert customers.key == ("id",)
    assert sorted(customers.rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "anne"},
        {"id": 4, "name": "dee again"},
    ]
    assert customers.deleted_keys is not None
    assert sorted(customers.deleted_keys.column("id").to_pylist()) == [2, 3]
    assert customers.deleted_keys.schema == pa.schema([pa.field("id", pa.int64(), nullable=False)])
    stats = process.last_stats
    assert (stats.rows, stats.deletes, stats.superseded, stats.dead_letters) == (2, 2, 4, 0)
    assert customers.table.schema().identifier_field_names() == {"id"}
    assert customers.table.schema().find_field("id").required


@pytest.mark.parametrize("vectorised", [True, False], ids=["arrow", "per-record"])
def test_upsert_records_and_delete_when(
    catalog_settings: CatalogSettings, catalog: Any, vectorised: bool
) -> None:
    """delete-when reads the record as ``when`` does: ``closed`` deletes even though the last
    change of key 8 is a closed account with a new balance. Arrow and per-record jmespath agree."""
    process = build_processor(_config(catalog_settings), catalog, vectorised=vectorised)
    account = {"kind": "account", "owner": "o", "balance": 10}
    out = _run(
        process,
        [
            {**account, "id": 7, "status": "open"},
            {**account, "id": 8, "status": "open"},
            {**account, "id": 7, "status": "open", "balance": 20},
            {**account, "id": 8, "status": "closed", "balance": 0},
            {**account, "id": 9, "status": "closed"},
        ],
    )
    accounts = out.tables["crm.accounts"]
    assert accounts.rows.to_pylist() == [{"id": 7, "owner": "o", "balance": 20, "status": "open"}]
    assert accounts.deleted_keys is not None
    assert sorted(accounts.deleted_keys.column("id").to_pylist()) == [8, 9]
    assert (process.last_stats.superseded, process.last_stats.deletes) == (2, 2)


@pytest.mark.parametrize("vectorised", [True, False], ids=["arrow", "per-record"])
def test_a_delete_when_that_raises_on_a_record_makes_it_a_bad_record_not_an_upsert(
    catalog_settings: CatalogSettings, catalog: Any, vectorised: bool
) -> None:
    """Issue 47 item 5, for ``delete-when``: raising on a record read as "no delete", so a record
    meant to delete its key upserted it. It is a bad record now; the other records are changes."""
    accounts = {
        "when": "kind == 'account'",
        "changes": {"format": "upsert", "key": ["id"], "delete-when": "ends_with(status, 'closed')"},
    }
    process = build_processor(_config(catalog_settings, **{"crm.accounts": accounts}), catalog, vectorised)
    account = {"kind": "account", "owner": "o"}
    out = _run(
        process,
        [
            {**account, "id": 1, "status": "open"},
            {**account, "id": 2},
            {**account, "id": 3, "status": "closed"},
        ],
    )
    table = out.tables["crm.accounts"]
    assert [r["id"] for r in table.rows.to_pylist()] == [1]
    assert table.deleted_keys is not None and table.deleted_keys.column("id").to_pylist() == [3]
    assert _offsets(out) == [START + 1]
    reason = deadletter.header(out.dead_letters[0], deadletter.REASON) or ""
    assert reason.startswith("delete-when \"ends_with(status, 'closed')\" failed: "), reason


def test_tombstones_are_filtered_and_truncates_are_dead_lettered_with_a_warning(
    catalog_settings: CatalogSettings, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    with caplog.at_level(logging.WARNING, logger="fanout_sink.transform.processor"):
        out = _run(
            process,
            [
                _event("c", None, {"id": 1, "name": "a"}),
                _event("d", {"id": 1, "name": "a"}, None),
                None,  # Debezium's tombstone after a delete, for log compaction
                _event("t", None, None),
                _event("c", None, {"id": 2, "name": "b"}),
            ],
        )
    assert out.tables["crm.customers"].rows.to_pylist() == [{"id": 2, "name": "b"}]
    stats = process.last_stats
    assert (stats.filtered, stats.truncates, stats.dead_letters, stats.superseded) == (1, 1, 1, 1)
    assert _offsets(out) == [START + 3]
    headers = dict(out.dead_letters[0].headers)
    assert headers[deadletter.STAGE] == b"truncate" and headers[deadletter.TABLE] == b"crm.customers"
    assert f"truncate event {TOPIC}[{PARTITION}]@{START + 3} not applied" in caplog.text
    assert "crm.customers" in caplog.text


def test_truncate_without_a_dead_letter_topic_is_filtered_and_still_warned(
    catalog_settings: CatalogSettings, catalog: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tables = {"crm.customers": {"changes": {"format": "debezium", "key": ["id"]}}}
    process = build_processor(_config(catalog_settings, dead_letter=False, **tables), catalog)
    with caplog.at_level(logging.WARNING):
        out = _run(process, [_event("t", None, None), _event("c", None, {"id": 1})])
    assert out.dead_letters == [] and process.last_stats.filtered == 1 and process.last_stats.truncates == 1
    assert f"@{START} not applied" in caplog.text


def test_null_keys_and_non_events_are_bad_records(catalog_settings: CatalogSettings, catalog: Any) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    out = _run(
        process,
        [
            _event("c", None, {"id": None, "name": "no key"}),
            _event("x", None, {"id": 1}),  # no Debezium op
            {"source": {"table": "customers"}, "after": {"id": 2}},  # no op at all
            _event("d", None, None),  # a delete without its before image: no key
            _event("c", None, {"id": 3, "name": "fine"}),
            {"kind": "account", "owner": "o"},  # an upsert record without its key
        ],
    )
    assert out.tables["crm.customers"].rows.to_pylist() == [{"id": 3, "name": "fine"}]
    assert _offsets(out) == [START, START + 1, START + 2, START + 3, START + 5]
    reasons = [dict(d.headers)[deadletter.REASON].decode() for d in out.dead_letters]
    assert "key column 'id' is null" in reasons[0]
    assert "op is 'x'" in reasons[1] and "op is None" in reasons[2]
    assert "key column 'id' is null" in reasons[4]
    assert dict(out.dead_letters[0].headers)[deadletter.COLUMN] == b"id"


def test_a_null_key_stops_the_sink_under_tolerance_none(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = build_processor(_config(catalog_settings, dead_letter=False), catalog)
    with pytest.raises(RecordError, match=rf"{TOPIC}\[{PARTITION}\]@{START + 1}.*key column 'id' is null"):
        _run(process, [_event("c", None, {"id": 1}), _event("u", None, {"id": None})])


def test_a_bad_update_leaves_the_keys_earlier_change_standing(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """A dead-lettered change is no change: the key's last good change wins."""
    process = build_processor(_config(catalog_settings), catalog)
    _run(process, [_event("c", None, {"id": 1, "n": 1})])  # creates the table: n is a long
    out = _run(process, [_event("u", None, {"id": 1, "n": 2}), _event("u", None, {"id": 1, "n": "many"})])
    assert out.tables["crm.customers"].rows.to_pylist() == [{"id": 1, "n": 2}]
    assert _offsets(out) == [START + 1]


def test_an_existing_table_keyed_otherwise_is_refused_naming_the_yaml_path(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    catalog.create_namespace("crm")
    catalog.create_table("crm.customers", schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    process = build_processor(_config(catalog_settings), catalog)
    with pytest.raises(
        TableError,
        match=r"exists without identifier fields, but its key is \['id'\] "
        r"\(tables.\"crm.customers\".changes.key\); make them its identifier fields "
        r"\(Spark SQL: ALTER TABLE crm.customers SET IDENTIFIER FIELDS id;",
    ):
        _run(process, [_event("c", None, {"id": 1})])
    other = _config(
        catalog_settings, **{"crm.customers": {"changes": {"format": "debezium", "key": ["name"]}}}
    )
    keyed = build_processor(
        _config(catalog_settings, **{"crm.people": {"changes": {"format": "debezium", "key": ["id"]}}}),
        catalog,
    )
    _run(keyed, [_event("c", None, {"id": 1, "name": "a"})])
    renamed = other.model_copy(update={"tables": {"crm.people": other.tables["crm.customers"]}})
    with pytest.raises(
        TableError,
        match=r"has identifier fields \['id'\], but its key is \['name'\] "
        r"\(tables.\"crm.people\".changes.key\)",
    ):
        _run(
            build_processor(renamed, load_catalog(catalog_settings)),
            [_event("c", None, {"id": 2, "name": "b"})],
        )


@pytest.mark.parametrize(
    ("after", "problem"),
    [({"id": {"a": 1}}, "not a primitive column"), ({"id": 1.5}, "floating-point")],
)
def test_key_columns_must_be_primitive_and_not_floating(
    catalog_settings: CatalogSettings, catalog: Any, after: dict[str, Any], problem: str
) -> None:
    process = build_processor(_config(catalog_settings), catalog)
    with pytest.raises(TableError, match=rf"key column 'id' .*{problem}.*changes.key"):
        _run(process, [_event("c", None, after)])


def test_a_key_the_rows_lack_is_refused_at_create(catalog_settings: CatalogSettings, catalog: Any) -> None:
    tables = {
        "crm.customers": {"select": "{name: after.name}", "changes": {"format": "upsert", "key": ["id"]}}
    }
    process = build_processor(_config(catalog_settings, **tables), catalog)
    out = _run(process, [{"after": {"id": 1, "name": "a"}}])
    assert "key column 'id' is missing" in dict(out.dead_letters[0].headers)[deadletter.REASON].decode()


@pytest.mark.parametrize(
    ("changes", "where", "message"),
    [
        ({"format": "debezium", "key": []}, 'tables."crm.c".changes.key', "at least 1 item"),
        ({"format": "upsert", "key": ["a.b"]}, 'tables."crm.c".changes.key', "not a top-level column"),
        ({"format": "upsert", "key": ["id", "id"]}, 'tables."crm.c".changes.key', "names a column twice"),
        ({"format": "cdc", "key": ["id"]}, 'tables."crm.c".changes.format', "'upsert' or 'debezium'"),
        (
            {"format": "upsert", "key": ["id"], "delete-when": "a =="},
            'tables."crm.c".changes.delete-when',
            "not a valid jmespath",
        ),
        (
            {"format": "debezium", "key": ["id"], "delete-when": "a"},
            'tables."crm.c".changes',
            "only for format upsert",
        ),
        ({"format": "upsert", "key": ["id"], "delete": "a"}, 'tables."crm.c".changes.delete', "unknown key"),
    ],
)
def test_config_errors_name_the_yaml_path(changes: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {"name": "s", "source": {"topics": ["t"]}, "tables": {"crm.c": {"changes": changes}}}, "sink.yaml"
        )
    assert f"sink.yaml: {where}" in str(raised.value) and message in str(raised.value)


def test_tombstones_cannot_be_dead_lettered_beside_change_tables() -> None:
    data = {
        "name": "s",
        "source": {"topics": ["t"], "tombstones": "dead-letter"},
        "dead-letter": {"topic": "d"},
        "tables": {"crm.c": {"changes": {"format": "upsert", "key": ["id"]}}},
    }
    with pytest.raises(
        ConfigError, match=r"source.tombstones: .*crm.c has changes.*set source.tombstones: skip"
    ):
        parse_config(data, "sink.yaml")


# --------------------------------------------------------------------------------------------
# Last change wins, against a model


def test_last_change_wins_across_upserts_and_deletes() -> None:
    upserts = pa.table({"k": [1, 2, 1]})
    deletes = pa.table({"k": [2, 3]})
    won, deleted = last_change_wins(upserts, np.array([0, 1, 5]), deletes, np.array([3, 4]))
    assert (won.tolist(), deleted.tolist()) == ([2], [0, 1])
    # A composite key: (1, a) and (1, b) are different keys.
    upserts = pa.table({"k": [1, 2, 1], "t": ["a", "a", "b"]})
    deletes = pa.table({"t": ["a", "b"], "k": [2, 3]})  # column order does not matter
    won, deleted = last_change_wins(upserts, np.array([0, 1, 5]), deletes, np.array([3, 4]))
    assert (won.tolist(), deleted.tolist()) == ([0, 2], [0, 1])


_change = st.tuples(st.sampled_from(["c", "u", "d"]), st.integers(0, 6), st.integers(0, 1000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(_change, min_size=1, max_size=40), slices=st.integers(1, 4))
def test_the_table_after_any_slices_is_the_model(
    tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[str, int, int]], slices: int
) -> None:
    """Replaying the slices' rows and deleted keys in order gives the model: a dict per key with
    the last change applied (deletes of absent keys are no-ops, updates of absent keys insert)."""
    catalog_settings = embedded_catalog_settings(tmp_path_factory.mktemp("model"))
    process = build_processor(_config(catalog_settings), load_catalog(catalog_settings))
    model: dict[int, int] = {}
    table: dict[int, int] = {}
    size = -(-len(changes) // slices)
    for start in range(0, len(changes), size):
        part = changes[start : start + size]
        events = []
        for op, key, value in part:
            row = {"id": key, "v": value}
            events.append(_event(op, row, None) if op == "d" else _event(op, None, row))
            if op == "d":
                model.pop(key, None)
            else:
                model[key] = value
        out = process(
            make_raw_slice(
                [json.dumps(e).encode() for e in events], topic=TOPIC, partition=0, start_offset=start
            )
        )
        stats = process.last_stats
        assert stats.reconciles() and stats.dead_letters == 0
        rows = out.tables["crm.customers"]
        deleted = [] if rows.deleted_keys is None else rows.deleted_keys.column("id").to_pylist()
        upserted = {r["id"]: r["v"] for r in rows.rows.to_pylist()}
        assert not set(deleted) & set(upserted)
        assert len(upserted) == rows.rows.num_rows  # one row per key
        for key in deleted:
            table.pop(key, None)
        table.update(upserted)
        assert stats.rows + stats.deletes == len({key for _, key, _ in part})
    assert table == model


# --------------------------------------------------------------------------------------------
# One dynamic route, many tables: key columns from the Kafka message keys


def _database_processor(catalog_settings: CatalogSettings, catalog: Any) -> RoutingProcessor:
    """One dynamic route over a database's Debezium topics, each table keyed by its message keys."""
    config = parse_config(
        {
            "name": "cdc",
            "source": {"pattern": "^dbserver1\\..*"},
            "catalog": catalog_settings.model_dump(),
            "dynamic": {
                "table": "join('.', ['crm', source.table])",
                "auto-create": True,
                "changes": {"format": "debezium"},
            },
            "dead-letter": {"topic": "dlq"},
        },
        "sink.yaml",
    )
    return build_processor(config, catalog)


def test_a_dynamic_route_replicates_tables_keyed_by_their_message_keys(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    process = _database_processor(catalog_settings, catalog)

    def event(table: str, op: str, row: dict[str, Any]) -> bytes:
        before, after = (row, None) if op == "d" else (None, row)
        return json.dumps({"op": op, "before": before, "after": after, "source": {"table": table}}).encode()

    customers = make_raw_slice(
        [
            event("customers", "c", {"id": 1, "name": "a"}),
            event("customers", "c", {"id": 2, "name": "b"}),
            event("customers", "d", {"id": 1, "name": "a"}),
            event("customers", "c", {"id": 3}),
        ],
        topic="dbserver1.crm.customers",
        keys=[b'{"id": 1}', b'{"id": 2}', b'{"id": 1}', None],
    )
    out = process(customers)
    assert process.last_stats.reconciles()
    table = out.tables["crm.customers"]
    assert table.key == ("id",) and table.table.schema().identifier_field_names() == {"id"}
    assert table.rows.to_pylist() == [{"id": 2, "name": "b"}]
    assert table.deleted_keys is not None and table.deleted_keys.to_pylist() == [{"id": 1}]
    assert _offsets(out) == [3]  # no message key
    assert "message key is no JSON object" in dict(out.dead_letters[0].headers)[deadletter.REASON].decode()

    # Connect's JSON wrapper around a composite key.
    key_schema = {
        "type": "struct",
        "fields": [{"type": "int32", "field": "order_id"}, {"type": "int32", "field": "line"}],
    }
    lines = [
        {"order_id": 5, "line": 1, "qty": 2},
        {"order_id": 5, "line": 2, "qty": 1},
        {"order_id": 5, "line": 1, "qty": 3},
    ]
    out = process(
        make_raw_slice(
            [event("order_lines", "c", line) for line in lines],
            topic="dbserver1.crm.order_lines",
            keys=[
                json.dumps(
                    {"schema": key_schema, "payload": {"order_id": x["order_id"], "line": x["line"]}}
                ).encode()
                for x in lines
            ],
        )
    )
    table = out.tables["crm.order_lines"]
    assert table.key == ("order_id", "line")
    assert table.table.schema().identifier_field_names() == {"order_id", "line"}
    assert sorted(table.rows.to_pylist(), key=lambda r: r["line"]) == [
        {"order_id": 5, "line": 1, "qty": 3},
        {"order_id": 5, "line": 2, "qty": 1},
    ]

    # Message keys that name other fields than the table's identifier fields: its records are
    # dead letters (as any record a dynamic table cannot take), saying which key disagrees.
    out = process(
        make_raw_slice(
            [event("customers", "c", {"id": 9, "cid": 9})],
            topic="dbserver1.crm.customers",
            keys=[b'{"cid": 9}'],
        )
    )
    assert out.tables == {} and process.last_stats.reconciles()
    reason = dict(out.dead_letters[0].headers)[deadletter.REASON].decode()
    assert (
        "the Kafka message key names ['cid'], but the table's key is ['id'] (the table's identifier fields)"
        in reason
    )


def test_one_odd_message_key_is_a_dead_letter_not_its_whole_slice(
    catalog_settings: CatalogSettings, catalog: Any
) -> None:
    """Issue 33 item 2: the key columns belong to the table. One record keyed ``{"id": 4, "v": 1}``
    among records keyed ``{"id": n}`` made the key ``(id, v)`` and dead-lettered every record of the
    slice as missing ``v``; now that record alone is the bad one, for a new table and an existing one."""
    process = _database_processor(catalog_settings, catalog)

    def items(ids: range, odd: int) -> RoutedSlice:
        rows = [{"id": n, "v": n * 10} for n in ids]
        keys = [json.dumps({"id": n, "v": 1} if n == odd else {"id": n}).encode() for n in ids]
        events = [json.dumps({"op": "c", "after": r, "source": {"table": "items"}}).encode() for r in rows]
        return process(make_raw_slice(events, topic="dbserver1.crm.items", keys=keys))

    for ids, odd in ((range(10), 4), (range(10, 13), 11)):  # creates the table, then finds it keyed
        out = items(ids, odd)
        assert process.last_stats.reconciles()
        table = out.tables["crm.items"]
        assert table.key == ("id",) and table.table.schema().identifier_field_names() == {"id"}
        assert sorted(r["id"] for r in table.rows.to_pylist()) == [n for n in ids if n != odd]
        assert _offsets(out) == [ids.index(odd)]
        reason = dict(out.dead_letters[0].headers)[deadletter.REASON].decode()
        assert "the Kafka message key names ['id', 'v'], but the table's key is ['id']" in reason


_any_record = st.one_of(
    st.builds(
        lambda op, k: _event(op, {"id": k}, None) if op == "d" else _event(op, None, {"id": k}),
        st.sampled_from(["c", "r", "u", "d"]),
        st.one_of(st.integers(0, 5), st.none(), st.just("x")),
    ),
    st.sampled_from([_event("t", None, None), _event("m", None, None), None, b"{not json", b"[1]"]),
    st.builds(
        lambda k, closed: {
            "kind": "account",
            "id": k,
            "owner": "o",
            "status": "closed" if closed else "open",
        },
        st.one_of(st.integers(0, 5), st.none()),
        st.booleans(),
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_any_record, min_size=1, max_size=30))
def test_each_change_record_has_exactly_one_outcome(
    tmp_path_factory: pytest.TempPathFactory, records: list[Any]
) -> None:
    """Good and bad changes, tombstones, truncates, non-events: the counts reconcile, each dead
    letter is a different record, and rows and deleted keys never share a key."""
    catalog_settings = embedded_catalog_settings(tmp_path_factory.mktemp("outcomes"))
    process = build_processor(_config(catalog_settings), load_catalog(catalog_settings))
    out = _run(process, records)  # asserts reconciles()
    offsets = _offsets(out)
    assert len(offsets) == len(set(offsets))
    for rows in out.tables.values():
        kept = set(rows.rows.column("id").to_pylist())
        deleted = set() if rows.deleted_keys is None else set(rows.deleted_keys.column("id").to_pylist())
        assert not kept & deleted and len(kept) == rows.rows.num_rows and None not in kept | deleted
    stats = process.last_stats
    assert stats.truncates == sum(isinstance(r, dict) and r.get("op") == "t" for r in records)
