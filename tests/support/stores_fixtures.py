"""Session fixtures for the real storage servers: an S3 object store (S3Proxy), an Iceberg REST catalog
(Nessie) and PostgreSQL, each started once per pytest session and stopped at its end, plus ready
``CatalogSettings`` on them with a warehouse prefix of each test's own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from fanout_sink.devtools.stack.object_store import ObjectStore, ObjectStoreState

WAREHOUSE_BUCKET = "warehouse"
"""The bucket the shared catalogs keep their tables in; tests write under a prefix of their own."""


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreState]:
    """The session's S3Proxy, with the bucket ``WAREHOUSE_BUCKET`` created."""
    server = ObjectStore(tmp_path_factory.mktemp("s3"))
    state = server.start()
    try:
        state.create_bucket(WAREHOUSE_BUCKET)
        yield state
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(object_store: ObjectStoreState) -> str:
    """A fresh ``s3://`` folder for one test."""
    return f"s3://{WAREHOUSE_BUCKET}/{uuid.uuid4().hex[:12]}"
