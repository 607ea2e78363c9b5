"""The real storage servers: each serves its clients, refuses a second start on the same work dir,
and keeps its data across a SIGKILL and a restart (what the cluster tests' kills rely on)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from support.stores_fixtures import WAREHOUSE_BUCKET

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack.object_store import ObjectStore, ObjectStoreState
from fanout_sink.devtools.stack.postgres import PostgresServer
from fanout_sink.devtools.stack.rest_catalog import RestCatalog, catalog_env_name
from fanout_sink.errors import StackError


def test_object_store_serves_pyarrow_with_signed_requests(
    object_store: ObjectStoreState, s3_prefix: str
) -> None:
    fs = object_store.filesystem()
    path = s3_prefix.removeprefix("s3://") + "/part-0.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3]}), path, filesystem=fs)

    assert pq.read_table(path, filesystem=fs)["id"].to_pylist() == [1, 2, 3]
    # The object is a plain file in the store's folder: the backend is the work dir, nothing in memory.
    assert (Path(object_store.data_dir) / path).is_file()
    wrong_key = dataclasses.replace(object_store, secret_access_key="not-the-secret")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        pq.read_table(path, filesystem=wrong_key.filesystem())


@pytest.mark.usefixtures("own_stores")
def test_object_store_refuses_a_second_start_and_keeps_objects_across_a_kill(tmp_path: Path) -> None:
    server = ObjectStore(tmp_path / "s3")
    state = server.start()
    try:
        state.create_bucket("kept")
        pq.write_table(pa.table({"id": [7]}), "kept/one.parquet", filesystem=state.filesystem())
        with pytest.raises(StackError, match="already running"):
            ObjectStore(tmp_path / "s3").start()

        server.kill()
        again = ObjectStore(tmp_path / "s3")
        restarted = again.start()
        try:
            # Same port and key pair: clients configured before the crash keep working.
            assert (restarted.port, restarted.access_key_id) == (state.port, state.access_key_id)
            table = pq.read_table("kept/one.parquet", filesystem=state.filesystem())
            assert table["id"].to_pylist() == [7]
        finally:
            again.stop()
    finally:
        server.kill()


def _append_two_batches(settings: CatalogSettings) -> str:
    """Create ``<name>.events`` (the settings' unique name as namespace), append two batches; its id."""
    catalog = load_catalog(settings)
    catalog.create_namespace(settings.name)
    identifier = f"{settings.name}.events"
    table = catalog.create_table(identifier, schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
    table.append(pa.table({"id": [1, 2], "name": ["a", "b"]}))
    table.append(pa.table({"id": [3], "name": ["c"]}))
    return identifier


def _rows(settings: CatalogSettings, identifier: str) -> list[tuple[int, str]]:
    """The table's rows, read by a catalog client of its own (nothing cached from the writer)."""
    table = load_catalog(settings).load_table(identifier)
    return sorted(zip(*table.scan().to_arrow().select(["id", "name"]).to_pydict().values(), strict=True))


def _object_files(store: ObjectStoreState, namespace: str) -> list[Path]:
    return [path for path in Path(store.data_dir).rglob("*") if path.is_file() and namespace in str(path)]


def test_rest_catalog_round_trip_on_s3_survives_a_kill(
    rest_catalog_process: RestCatalog,
    rest_s3_catalog_settings: CatalogSettings,
    object_store: ObjectStoreState,
) -> None:
    settings = rest_s3_catalog_settings
    identifier = _append_two_batches(settings)
    assert _rows(settings, identifier) == [(1, "a"), (2, "b"), (3, "c")]
    # The catalog wrote the metadata and PyIceberg the Parquet files to the store, nothing local.
    files = _object_files(object_store, settings.name)
    assert any(p.suffix == ".parquet" for p in files) and any(
        p.name.endswith(".metadata.json") for p in files
    )

    # Answers a client error (404, 409) as the protocol says, without an ERROR in the server's log.
    catalog = load_catalog(settings)
    with pytest.raises(NoSuchTableError):
        catalog.load_table(f"{settings.name}.missing")
    with pytest.raises(NamespaceAlreadyExistsError):
        catalog.create_namespace(settings.name)
    log = rest_catalog_process.log_file.read_text()
    assert f"serving the Iceberg REST catalog on {rest_catalog_process.state.uri}" in log  # loopback only
    assert " ERROR " not in log and " SEVERE " not in log, log[-3000:]

    with pytest.raises(StackError, match="already running"):
        RestCatalog(rest_catalog_process.work_dir, object_store, WAREHOUSE_BUCKET).start()
    port = rest_catalog_process.state.port if rest_catalog_process.state else None
    rest_catalog_process.kill()
    restarted = rest_catalog_process.start()
    # Same URI, and the commits are in the catalog's SQLite file: the table reads back whole.
    assert restarted.port == port
    assert _rows(settings, identifier) == [(1, "a"), (2, "b"), (3, "c")]


def test_catalog_properties_reach_the_launcher_under_the_fixtures_variable_names() -> None:
    """The launcher maps ``CATALOG_X`` to property ``x`` as the fixture does (``__`` -> ``-``, ``_`` ->
    ``.``, lower case); these are the inverse names, and a key that has none is refused."""
    assert catalog_env_name("s3.access-key-id") == "CATALOG_S3_ACCESS__KEY__ID"
    assert catalog_env_name("io-impl") == "CATALOG_IO__IMPL"
    assert catalog_env_name("uri") == "CATALOG_URI"
    with pytest.raises(StackError, match="cannot be passed"):
        catalog_env_name("jdbc.busy_timeout")


def test_postgres_catalog_round_trip_on_s3(
    postgres_s3_catalog_settings: CatalogSettings, object_store: ObjectStoreState
) -> None:
    settings = postgres_s3_catalog_settings
    identifier = _append_two_batches(settings)
    assert _rows(settings, identifier) == [(1, "a"), (2, "b"), (3, "c")]
    assert str(settings.warehouse).startswith("s3://")
    assert any(
        p.suffix == ".parquet" for p in _object_files(object_store, str(settings.warehouse).split("/")[-1])
    )


def test_postgres_refuses_a_second_start_keeps_data_across_a_kill_and_wants_the_password(
    tmp_path: Path, object_store: ObjectStoreState, s3_prefix: str
) -> None:
    server = PostgresServer(tmp_path / "pg")
    state = server.start()
    try:
        settings = CatalogSettings.model_validate(
            {"name": "kept", "type": "sql", "uri": state.sqlalchemy_uri, "warehouse": s3_prefix,
             **object_store.pyiceberg_properties()}
        )  # fmt: skip
        identifier = _append_two_batches(settings)
        with pytest.raises(StackError, match="already running"):
            PostgresServer(tmp_path / "pg").start()

        server.kill()
        restarted = server.start()
        assert (restarted.port, restarted.password) == (state.port, state.password)
        assert _rows(settings, identifier) == [(1, "a"), (2, "b"), (3, "c")]
        wrong = settings.model_copy(update={"uri": state.sqlalchemy_uri.replace(state.password, "wrong")})
        with pytest.raises(Exception, match="password authentication failed"):
            load_catalog(wrong).list_namespaces()
    finally:
        server.discard()
