"""A REST catalog the project did not start: the auth handshake both engines make with the catalog
properties PyIceberg and Iceberg Java share (``credential`` with ``oauth2-server-uri`` and ``scope``,
or a bearer ``token``), and the ``prefix`` the server hands out in ``/v1/config``.

No real external catalog is reachable here, so a stub answers only the handshake: its token
endpoint, ``/v1/config`` and the namespace listing under the prefix; it records each request's
Authorization header. Table operations against a real REST server are in tests/devtools/test_stores.py
and tests/spark/test_spark_object_store.py (the project's own server). What this leaves untested is
listed in docs/production.md ("A REST catalog you run").
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from support.sql_cli import run_sql_cli, write_sql_config

from fanout_sink.catalog import CatalogSettings, java_catalog_properties, load_catalog, local_warehouse_path
from fanout_sink.config.loading import load_config

CLIENT_ID, CLIENT_SECRET = "sink-client", "s3cr3t-client-secret"
BEARER = "static-bearer-token-0042"
ISSUED = "issued-access-token-7"
PREFIX = "wh-7f3a"
WAREHOUSE = "analytics"


@dataclass
class Seen:
    """One request the stub answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    form: dict[str, list[str]] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    server: _Stub

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads ``seen``
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        form = parse_qs(body)
        basic = self.headers.get("Authorization", "")
        if basic.startswith("Basic "):  # client id and secret may come as HTTP basic auth instead
            client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
            form.setdefault("client_id", [client_id])
            form.setdefault("client_secret", [secret])
        self.server.seen.append(Seen("POST", parts.path, parse_qs(parts.query), basic or None, form))
        good = form.get("client_id") == [CLIENT_ID] and form.get("client_secret") == [CLIENT_SECRET]
        if parts.path != "/oauth/token" or form.get("grant_type") != ["client_credentials"] or not good:
            self._answer(401, {"error": "invalid_client", "error_description": "bad client credentials"})
            return
        self._answer(200, {"access_token": ISSUED, "token_type": "bearer", "expires_in": 3600,
                           "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})  # fmt: skip

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        authorization = self.headers.get("Authorization")
        self.server.seen.append(Seen("GET", parts.path, parse_qs(parts.query), authorization))
        if authorization not in {f"Bearer {ISSUED}", f"Bearer {BEARER}"}:
            self._answer(401, {"error": {"message": "not authorized", "type": "NotAuthorizedException",
                                         "code": 401}})  # fmt: skip
        elif parts.path == "/v1/config":
            self._answer(200, {"defaults": {}, "overrides": {"prefix": PREFIX}})
        elif parts.path == f"/v1/{PREFIX}/namespaces":
            self._answer(200, {"namespaces": [["sales"], ["ops"]]})
        else:
            missing = {"message": f"no {parts.path} here", "type": "NoSuchNamespaceException", "code": 404}
            self._answer(404, {"error": missing})


class _Stub(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[Seen] = []

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _client_credentials(stub: _Stub) -> CatalogSettings:
    return CatalogSettings.model_validate(
        {"name": "external", "type": "rest", "uri": stub.uri, "warehouse": WAREHOUSE,
         "credential": f"{CLIENT_ID}:{CLIENT_SECRET}", "oauth2-server-uri": f"{stub.uri}/oauth/token",
         "scope": "PRINCIPAL_ROLE:sink"}
    )  # fmt: skip


def _check_handshake(seen: list[Seen], scope: str | None, token: str) -> None:
    """A token first (when client credentials are given; a client may ask again once the config
    is merged), then ``/v1/config`` naming the warehouse, then the listing under the server's prefix:
    every catalog request with the bearer token."""
    posts = [request for request in seen if request.method == "POST"]
    gets = [request for request in seen if request.method == "GET"]
    if scope is None:
        assert not posts, posts
    else:
        assert seen[0] is posts[0], seen
        for post in posts:
            assert post.path == "/oauth/token" and post.form["scope"] == [scope], post
            assert post.form["grant_type"] == ["client_credentials"], post
    assert gets[0].path == "/v1/config" and gets[0].query.get("warehouse") == [WAREHOUSE], gets[0]
    assert {request.path for request in gets[1:]} == {f"/v1/{PREFIX}/namespaces"}, gets
    assert {request.authorization for request in gets} == {f"Bearer {token}"}


def test_pyiceberg_gets_a_token_with_client_credentials_and_uses_the_server_prefix(stub: _Stub) -> None:
    catalog = load_catalog(_client_credentials(stub))
    assert sorted(catalog.list_namespaces()) == [("ops",), ("sales",)]
    _check_handshake(stub.seen, "PRINCIPAL_ROLE:sink", ISSUED)


def test_pyiceberg_sends_a_bearer_token_as_given(stub: _Stub) -> None:
    settings = CatalogSettings.model_validate(
        {"name": "external", "type": "rest", "uri": stub.uri, "warehouse": WAREHOUSE, "token": BEARER}
    )
    assert sorted(load_catalog(settings).list_namespaces()) == [("ops",), ("sales",)]
    _check_handshake(stub.seen, None, BEARER)


def test_a_rest_warehouse_name_is_not_a_local_folder(stub: _Stub, tmp_path: Path, monkeypatch: Any) -> None:
    """``warehouse: analytics`` names the server's warehouse: no fsync FileIO, no folder probed or
    made in the working folder, and Spark's catalog says oauth2 outright (no warning to ask for it)."""
    monkeypatch.chdir(tmp_path)
    settings = _client_credentials(stub)
    assert "py-io-impl" not in load_catalog(settings).properties
    java = java_catalog_properties(settings)
    assert java["rest.auth.type"] == "oauth2" and java["warehouse"] == WAREHOUSE
    assert java["credential"] == f"{CLIENT_ID}:{CLIENT_SECRET}" and java["scope"] == "PRINCIPAL_ROLE:sink"
    assert list(tmp_path.iterdir()) == []
    assert local_warehouse_path(settings) is None  # what the start-up check probes: nothing
    local = {"name": "x", "type": "sql", "uri": "sqlite:///c.db"}
    for warehouse, folder in (("file:///srv/wh", Path("/srv/wh")), ("wh", Path("wh"))):
        assert (
            local_warehouse_path(CatalogSettings.model_validate({**local, "warehouse": warehouse})) == folder
        )


def test_the_config_redacts_the_credential_and_the_token(stub: _Stub, tmp_path: Path) -> None:
    config = load_config(write_sql_config(tmp_path, _client_credentials(stub)))
    shown = json.dumps(config.redacted())
    assert CLIENT_SECRET not in shown and '"credential": "***"' in shown
    assert CLIENT_SECRET not in repr(config)


@pytest.mark.usefixtures("own_spark")
def test_spark_sql_on_the_external_catalog_makes_the_same_handshake(stub: _Stub, tmp_path: Path) -> None:
    """``fanout-sink sql`` (Iceberg Java's RESTCatalog in Spark, from the same catalog section):
    token with the scope, the bearer on /v1/config and under the prefix; the secret in no output."""
    config = write_sql_config(tmp_path, _client_credentials(stub))

    done = run_sql_cli("--config", str(config), "--format", "json", "-e", "SHOW NAMESPACES")

    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(json.loads(line)["namespace"] for line in done.stdout.splitlines()) == ["ops", "sales"]
    _check_handshake(stub.seen, "PRINCIPAL_ROLE:sink", ISSUED)
    assert CLIENT_SECRET not in done.stdout + done.stderr
    assert "Inferring rest.auth.type" not in done.stderr
