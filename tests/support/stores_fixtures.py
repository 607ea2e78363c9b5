"""Session fixtures for the real storage servers: an S3 object store (S3Proxy), Iceberg's own REST catalog
and PostgreSQL, each started once per pytest session (on first use) and stopped at its end,
plus ready ``CatalogSettings`` on them, fresh per test.

The servers are shared, so a test keeps to its own corner: ``rest_s3_catalog_settings`` and
``postgres_s3_catalog_settings`` carry a unique catalog ``name``; use it as the test's namespace. The
``*_process`` fixtures hand out the server objects themselves, for tests that kill and restart them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout_sink.catalog import CatalogSettings
from fanout_sink.devtools.stack.object_store import ObjectStore, ObjectStoreState
from fanout_sink.devtools.stack.postgres import PostgresServer, PostgresState
from fanout_sink.devtools.stack.rest_catalog import RestCatalog, RestCatalogState

WAREHOUSE_BUCKET = "warehouse"
"""The bucket the shared catalogs keep their tables in; tests write under a prefix of their own."""


@pytest.fixture(scope="session")
def object_store_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    server = ObjectStore(tmp_path_factory.mktemp("s3"))
    state = server.start()
    try:
        state.create_bucket(WAREHOUSE_BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def object_store(object_store_process: ObjectStore) -> ObjectStoreState:
    """The session's S3Proxy, with the bucket ``WAREHOUSE_BUCKET`` created."""
    assert object_store_process.state is not None
    return object_store_process.state


def fresh_s3_prefix() -> str:
    """A new ``s3://`` folder in the shared bucket."""
    return f"s3://{WAREHOUSE_BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_prefix(object_store: ObjectStoreState) -> str:
    """A fresh ``s3://`` folder for one test."""
    return fresh_s3_prefix()


@pytest.fixture(scope="session")
def rest_catalog_process(
    tmp_path_factory: pytest.TempPathFactory, object_store: ObjectStoreState
) -> Iterator[RestCatalog]:
    server = RestCatalog(tmp_path_factory.mktemp("rest"), object_store, WAREHOUSE_BUCKET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rest_catalog_server(rest_catalog_process: RestCatalog) -> RestCatalogState:
    """The session's Iceberg REST catalog (its state in a SQLite file), its tables in
    ``s3://WAREHOUSE_BUCKET/``."""
    assert rest_catalog_process.state is not None
    return rest_catalog_process.state


@pytest.fixture(scope="session")
def postgres_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    server.start()
    try:
        yield server
    finally:
        server.discard()


@pytest.fixture(scope="session")
def postgres_server(postgres_process: PostgresServer) -> PostgresState:
    """The session's PostgreSQL, with the database ``iceberg``."""
    assert postgres_process.state is not None
    return postgres_process.state


def _unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def rest_s3_settings(rest: RestCatalogState, store: ObjectStoreState) -> CatalogSettings:
    """Iceberg REST with the S3 store's keys: PyIceberg writes the data files itself."""
    return CatalogSettings.model_validate(
        {"name": _unique_name("rest"), "type": "rest", "uri": rest.uri, **store.pyiceberg_properties()}
    )


def postgres_s3_settings(postgres: PostgresState, store: ObjectStoreState) -> CatalogSettings:
    """PyIceberg's SQL catalog on PostgreSQL, its warehouse a fresh prefix of the S3 store. The catalog
    name is unique, and the SQL catalog keys every row by it: nobody sees another's tables."""
    return CatalogSettings.model_validate(
        {"name": _unique_name("pg"), "type": "sql", "uri": postgres.sqlalchemy_uri,
         "warehouse": fresh_s3_prefix(), **store.pyiceberg_properties()}
    )  # fmt: skip


def sqlite_s3_settings(store: ObjectStoreState, folder: Path) -> CatalogSettings:
    """The embedded SQL catalog (its file in ``folder``) with its warehouse on the object store."""
    return CatalogSettings.model_validate(
        {"name": _unique_name("lake"), "type": "sql", "uri": f"sqlite:///{folder / 'catalog.db'}",
         "warehouse": fresh_s3_prefix(), **store.pyiceberg_properties()}
    )  # fmt: skip


@pytest.fixture
def rest_s3_catalog_settings(
    rest_catalog_server: RestCatalogState, object_store: ObjectStoreState
) -> CatalogSettings:
    return rest_s3_settings(rest_catalog_server, object_store)


@pytest.fixture
def postgres_s3_catalog_settings(
    postgres_server: PostgresState, object_store: ObjectStoreState
) -> CatalogSettings:
    return postgres_s3_settings(postgres_server, object_store)
