"""The real storage servers: each serves its clients, refuses a second start on the same work dir,
and keeps its data across a SIGKILL and a restart (what the cluster tests' kills rely on)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fanout_sink.devtools.stack.object_store import ObjectStore, ObjectStoreState
from fanout_sink.errors import StackError

pytestmark = pytest.mark.stores


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
