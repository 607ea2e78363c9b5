"""``fanout-sink stack up | status | down`` for people, run as the real command in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy
from confluent_kafka.admin import AdminClient

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.stack import daemon
from fanout_sink.devtools.stack.object_store import ObjectStoreState
from fanout_sink.devtools.stack.service import http_status
from fanout_sink.processes import pid_alive

CLI = [sys.executable, "-m", "fanout_sink.cli"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=600, check=False,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


@pytest.mark.usefixtures("own_broker")
def test_stack_up_status_down_round_trip(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "stack")
    try:
        first = _cli("stack", "up", "--dir", state_dir, "--json")
        assert first.returncode == 0, first.stderr
        up = json.loads(first.stdout)
        assert up["started"] is True and up["bootstrap.servers"].startswith("127.0.0.1:")

        again = _cli("stack", "up", "--dir", state_dir)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == f"bootstrap.servers={up['bootstrap.servers']}"
        assert "already running" in again.stderr

        status = _cli("stack", "status", "--dir", state_dir, "--json")
        assert status.returncode == 0
        report = json.loads(status.stdout)
        assert report["running"] is True and report["pid"] == up["pid"]
        metadata = AdminClient({"bootstrap.servers": up["bootstrap.servers"]}).list_topics(timeout=30)
        assert metadata.brokers, "the broker answers metadata requests"
    finally:
        down = _cli("stack", "down", "--dir", state_dir)
    assert down.returncode == 0
    after = _cli("stack", "status", "--dir", state_dir, "--json")
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False


def test_status_of_a_stack_never_started(tmp_path: Path) -> None:
    result = _cli("stack", "status", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 1
    assert "fanout-sink stack up" in result.stdout


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_up_with_stores_status_and_down(tmp_path: Path) -> None:
    """The production shape of the REST catalog: its state in the stack's PostgreSQL, tables on S3."""
    stack_dir = str(tmp_path / "stack")
    on_postgres = {daemon.REST_CATALOG_DB_ENV: "postgres"}
    try:
        up = _cli("stack", "up", "--dir", stack_dir, "--with", "s3,postgres,rest", "--json", env=on_postgres)
        assert up.returncode == 0, up.stderr
        started = json.loads(up.stdout)
        assert all(started[name]["started"] is True for name in ("s3", "postgres", "rest"))
        assert "***" in started["postgres"]["uri"], "the password is not printed"

        report = json.loads(_cli("stack", "status", "--dir", stack_dir, "--json").stdout)
        s3, pg, rest = (report["services"][name] for name in ("s3", "postgres", "rest"))
        assert s3["running"] and pg["running"] and rest["running"]
        store = ObjectStoreState(**{k: s3[k] for k in ObjectStoreState.__dataclass_fields__})
        assert store.create_bucket("from-status") == "s3://from-status"
        engine = sqlalchemy.create_engine(
            f"postgresql+psycopg2://{pg['user']}:{pg['password']}@127.0.0.1:{pg['port']}/{pg['database']}"
        )
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("select 1")).scalar() == 1
        engine.dispose()

        catalog = load_catalog(
            CatalogSettings.model_validate(
                {"name": "stack", "type": "rest", "uri": rest["uri"], **store.pyiceberg_properties()}
            )
        )
        catalog.create_namespace("shop")
        table = catalog.create_table("shop.orders", schema=pa.schema([("id", pa.int64())]))
        table.append(pa.table({"id": [1, 2]}))
        assert table.location().startswith(f"s3://{daemon.WAREHOUSE_BUCKET}/")
        assert rest["database"] == f"jdbc:postgresql://127.0.0.1:{pg['port']}/{daemon.REST_CATALOG_DATABASE}"
        rest_db = engine.url.set(database=daemon.REST_CATALOG_DATABASE)
        engine = sqlalchemy.create_engine(rest_db)
        with engine.connect() as connection:
            tables = connection.execute(
                sqlalchemy.text("select table_namespace, table_name from iceberg_tables")
            )
            assert [tuple(row) for row in tables] == [("shop", "orders")], (
                "the catalog's rows are in PostgreSQL"
            )
        engine.dispose()

        text = _cli("stack", "status", "--dir", stack_dir).stdout
        assert f"s3: running  s3.endpoint={store.endpoint}" in text and ":***@" in text
        assert f"rest: running  type=rest  uri={rest['uri']}" in text
        again = _cli("stack", "up", "--dir", stack_dir, "--with", "s3")
        assert again.returncode == 0 and "S3 object store (S3Proxy) already running" in again.stderr
    finally:
        down = _cli("stack", "down", "--dir", stack_dir)
    assert down.returncode == 0, down.stderr
    after = json.loads(_cli("stack", "status", "--dir", stack_dir, "--json").stdout)
    assert not any(after["services"][name]["running"] for name in ("s3", "postgres", "rest"))


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_the_rest_catalog_on_postgres_needs_the_stacks_postgres(tmp_path: Path) -> None:
    result = _cli(
        "stack", "serve", "rest", "--dir", str(tmp_path), env={
            daemon.REST_CATALOG_DB_ENV: "postgres", "FANOUT_SINK_S3_ENDPOINT": "http://127.0.0.1:9",
            "FANOUT_SINK_S3_ACCESS_KEY_ID": "k", "FANOUT_SINK_S3_SECRET_ACCESS_KEY": "s",
        },
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        "no PostgreSQL runs in this stack folder" in result.stderr
        and "--with s3,postgres,rest" in result.stderr
    )


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_serve_runs_in_the_foreground_until_sigterm(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        [*CLI, "stack", "serve", "s3", "--dir", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert serving.stdout is not None
        line = json.loads(serving.stdout.readline())
        assert line["serving"] == "s3" and http_status(f"http://127.0.0.1:{line['port']}/") == 403
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 0
        assert not pid_alive(line["pid"]), "stopping the command stops the server"
    finally:
        serving.kill()


@pytest.mark.usefixtures("own_broker", "own_stores")
def test_stack_serve_rest_without_a_store_says_how_to_give_it_one(tmp_path: Path) -> None:
    result = _cli("stack", "serve", "rest", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert "needs an S3 store" in result.stderr and "FANOUT_SINK_S3_ENDPOINT" in result.stderr


def test_stack_down_with_stops_only_the_named_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``up --with hive-metastore`` has its way back: ``down --with hive-metastore`` (two stand-in
    processes under the servers' state files; the one not named keeps running)."""
    from fanout_sink import cli

    stack_dir = tmp_path / "stack"
    sleepers = {}
    for name, fields in (
        ("hive-metastore", {"port": 1, "warehouse_location": "w", "database": "d"}),
        ("spark-master", {"port": 2, "webui_port": 3}),
    ):
        sleepers[name] = subprocess.Popen(["sleep", "300"], start_new_session=True)
        folder = stack_dir / name
        folder.mkdir(parents=True)
        state = {**fields, "pid": sleepers[name].pid, "log_file": str(folder / f"{name}.log")}
        (folder / f"{name}.json").write_text(json.dumps(state))
    try:
        assert cli.main(["stack", "down", "--dir", str(stack_dir), "--with", "hive-metastore"]) == 0
        assert sleepers["hive-metastore"].wait(30) is not None
        assert sleepers["spark-master"].poll() is None, "not named: still running"
        assert capsys.readouterr().err == "Hive Metastore stopped\n"
        assert cli.main(["stack", "down", "--dir", str(stack_dir), "--with", "hive-metastore"]) == 0
        assert capsys.readouterr().err == f"Hive Metastore was not running (state folder {stack_dir})\n"
        assert cli.main(["stack", "down", "--dir", str(stack_dir)]) == 0
        assert sleepers["spark-master"].wait(30) is not None
        assert capsys.readouterr().err == "Spark standalone master stopped\n"
    finally:
        for sleeper in sleepers.values():
            sleeper.kill()
            sleeper.wait()


def test_stack_up_names_the_credentials_only_for_servers_that_have_them() -> None:
    assert [name for name, service in daemon.SERVICES.items() if service.credentials] == [
        "s3",
        "postgres",
        "rest",
    ]
