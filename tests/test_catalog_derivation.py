"""One ``catalog:`` section, two engines: the Spark side derived from PyIceberg's property names, and
a catalog named in PyIceberg's own configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from fanout_sink.catalog import (
    CatalogSettings,
    java_catalog_properties,
    jdbc_catalog_properties,
    load_catalog,
    spark_catalog_conf,
    spark_storage_conf,
)
from fanout_sink.cli import main
from fanout_sink.config.loading import load_config, parse_config, write_standalone_copy
from fanout_sink.config.secrets import SECRET_KEY_PATTERN
from fanout_sink.errors import CatalogNotFoundError, ConfigError

S3 = {
    "s3.endpoint": "http://127.0.0.1:9000",
    "s3.access-key-id": "AKIDEXAMPLE",
    "s3.secret-access-key": "store-secret",
    "s3.region": "eu-west-1",
}
S3A = "org.apache.hadoop.fs.s3a"


@pytest.fixture(autouse=True)
def _no_user_pyiceberg_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PyIceberg looks in $PYICEBERG_HOME, ~ and the working folder: point all three at empty folders."""
    for name in [k for k in os.environ if k.upper().startswith("PYICEBERG_")]:
        monkeypatch.delenv(name)
    empty = tmp_path / "empty-home"
    empty.mkdir()
    monkeypatch.setenv("HOME", str(empty))
    monkeypatch.chdir(empty)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "postgresql+psycopg2://iceberg:s%40cret@127.0.0.1:5432/iceberg",
            {
                "uri": "jdbc:postgresql://127.0.0.1:5432/iceberg",
                "jdbc.user": "iceberg",
                "jdbc.password": "s@cret",
            },
        ),
        (
            "postgresql://u:pw@db.example.com/cat?sslmode=require",
            {
                "uri": "jdbc:postgresql://db.example.com/cat?sslmode=require",
                "jdbc.user": "u",
                "jdbc.password": "pw",
            },
        ),
        (
            "postgresql+psycopg://u@[::1]:6543/cat",
            {"uri": "jdbc:postgresql://[::1]:6543/cat", "jdbc.user": "u"},
        ),
        ("postgres://h:5432/cat", {"uri": "jdbc:postgresql://h:5432/cat"}),
        (  # SQLAlchemy's own parsing: the password runs to the '@', slashes and colons included
            "postgresql+psycopg2://iceberg:pw/with:colon@db.example.com:5432/cat",
            {
                "uri": "jdbc:postgresql://db.example.com:5432/cat",
                "jdbc.user": "iceberg",
                "jdbc.password": "pw/with:colon",
            },
        ),
    ],
)
def test_sqlalchemy_uri_becomes_jdbc_without_credentials(uri: str, expected: dict[str, str]) -> None:
    props = jdbc_catalog_properties(uri)
    assert props == expected
    assert "@" not in props["uri"] and "pw" not in props["uri"] and "cret" not in props["uri"]


def test_sqlite_stays_a_file(tmp_path: Path) -> None:
    settings = CatalogSettings(name="lake", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse="file:///w")
    conf = spark_catalog_conf(settings)
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.uri"] == f"jdbc:sqlite:{tmp_path / 'c.db'}"
    assert conf["spark.sql.catalog.lake.warehouse"] == "file:///w"
    assert "spark.sql.catalog.lake.io-impl" not in conf
    assert spark_storage_conf(settings) == {}


def test_postgres_catalog_on_s3_maps_jdbc_and_s3_file_io() -> None:
    settings = CatalogSettings(
        name="pg",
        type="sql",
        uri="postgresql+psycopg2://iceberg:pw@127.0.0.1:5432/iceberg",
        warehouse="s3://bucket/wh",
        **S3,
    )
    props = java_catalog_properties(settings)
    assert props == {
        "type": "jdbc",
        "uri": "jdbc:postgresql://127.0.0.1:5432/iceberg",
        "jdbc.user": "iceberg",
        "jdbc.password": "pw",
        "warehouse": "s3://bucket/wh",
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.access-key-id": "AKIDEXAMPLE",
        "s3.secret-access-key": "store-secret",
        "client.region": "eu-west-1",
        "s3.path-style-access": "true",  # pyarrow addresses by path when an endpoint is given
    }


def test_rest_properties_keep_iceberg_java_names() -> None:
    rest = {
        "credential": "client:secret",
        "token": "tok",
        "oauth2-server-uri": "https://idp/token",
        "scope": "catalog sql",
        "audience": "aud",
        "resource": "res",
        "prefix": "main",
        "header.X-Iceberg-Access-Delegation": "",
        "header.Authorization": "Bearer abc",
        "rest.sigv4-enabled": "true",
        "rest.signing-region": "us-east-1",
        "rest.signing-name": "glue",
        "snapshot-loading-mode": "refs",
    }
    settings = CatalogSettings(
        name="prod", type="rest", uri="http://127.0.0.1:19120/iceberg", warehouse="wh", **rest
    )
    props = java_catalog_properties(settings)
    assert props == {"type": "rest", "uri": "http://127.0.0.1:19120/iceberg", "warehouse": "wh", **rest}


@pytest.mark.parametrize(
    ("given", "path_style"),
    [
        ({"s3.endpoint": "http://127.0.0.1:9000"}, "true"),
        ({"s3.endpoint": "https://minio:9000", "s3.force-virtual-addressing": "true"}, "false"),
        ({"s3.endpoint": "http://x", "s3.force-virtual-addressing": "false"}, "true"),
        ({"s3.endpoint": "http://x", "s3.path-style-access": "false"}, "false"),
        ({"s3.region": "us-east-1"}, None),  # AWS itself: the SDK's virtual hosts
    ],
)
def test_path_style_follows_pyarrow(given: dict[str, str], path_style: str | None) -> None:
    props = java_catalog_properties(CatalogSettings(name="c", type="rest", uri="http://r", **given))
    assert props.get("s3.path-style-access") == path_style
    assert props["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert "s3.force-virtual-addressing" not in props


def test_client_fallbacks_assume_role_sse_and_pyiceberg_only_keys() -> None:
    settings = CatalogSettings(
        name="c",
        type="glue",
        warehouse="s3://b/w",
        **{
            "client.access-key-id": "AK",
            "client.secret-access-key": "SK",
            "client.session-token": "ST",
            "client.region": "us-west-2",
            "s3.access-key-id": "AK-S3",  # PyIceberg prefers the s3.* name over client.*
            "s3.role-arn": "arn:aws:iam::1:role/r",
            "s3.role-session-name": "sink",
            "s3.sse-kms-key-id": "kms-key",
            "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO",
            "glue.id": "123",
        },
    )
    props = java_catalog_properties(settings)
    assert props["s3.access-key-id"] == "AK-S3"
    assert props["s3.secret-access-key"] == "SK"
    assert props["s3.session-token"] == "ST"
    assert props["client.region"] == "us-west-2"
    assert props["client.assume-role.arn"] == "arn:aws:iam::1:role/r"
    assert props["client.assume-role.session-name"] == "sink"
    assert props["client.assume-role.region"] == "us-west-2"
    assert props["client.factory"] == "org.apache.iceberg.aws.AssumeRoleAwsClientFactory"
    assert (props["s3.sse.type"], props["s3.sse.key"]) == ("kms", "kms-key")
    assert props["glue.id"] == "123" and props["type"] == "glue"
    assert not any(key.startswith(("py-", "client.access-key-id", "client.secret")) for key in props)


def test_gcs_and_adls_keys() -> None:
    settings = CatalogSettings(
        name="c",
        type="rest",
        uri="http://r",
        **{
            "gcs.project-id": "p",
            "gcs.oauth2.token": "t",
            "gcs.endpoint": "http://gcs:4443",
            "adls.account-name": "acct",
            "adls.account-key": "key==",
            "adls.sas-token": "sv=1",
        },
    )
    props = java_catalog_properties(settings)
    assert props["gcs.project-id"] == "p" and props["gcs.oauth2.token"] == "t"
    assert props["gcs.service.host"] == "http://gcs:4443"
    assert props["adls.auth.shared-key.account.name"] == "acct"
    assert props["adls.auth.shared-key.account.key"] == "key=="
    assert props["adls.sas-token.acct.dfs.core.windows.net"] == "sv=1" and "adls.sas-token" not in props
    assert "io-impl" not in props  # GCS/ADLS FileIO jars are not shipped: Java's default applies


def test_s3a_checkpoint_conf_from_the_same_properties() -> None:
    settings = CatalogSettings(name="c", type="rest", uri="http://r", warehouse="s3://b/w", **S3)
    assert spark_storage_conf(settings) == {
        "spark.hadoop.fs.s3.impl": f"{S3A}.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.access.key": "AKIDEXAMPLE",
        "spark.hadoop.fs.s3a.secret.key": "store-secret",
        "spark.hadoop.fs.s3a.aws.credentials.provider": f"{S3A}.SimpleAWSCredentialsProvider",
    }
    with_token = CatalogSettings(
        name="c",
        type="rest",
        uri="http://r",
        **{**S3, "s3.endpoint": "https://s3.example", "s3.session-token": "t"},
    )
    conf = spark_storage_conf(with_token)
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert conf["spark.hadoop.fs.s3a.session.token"] == "t"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")


def test_every_derived_secret_is_redacted_by_spark() -> None:
    """Spark hides a conf entry whose key matches spark.redaction.regex: every secret value the
    derivation produces must sit under such a key."""
    settings = CatalogSettings(
        name="c",
        type="sql",
        uri="postgresql+psycopg2://u:pg-secret@h:5432/db",
        warehouse="s3://b/w",
        **{
            **S3,
            "s3.session-token": "sess-secret",
            "credential": "id:oauth-secret",
            "token": "bearer-secret",
            "header.Authorization": "Bearer header-secret",
            "adls.account-key": "adls-secret",
            "adls.sas-token": "sas-secret",
            "gcs.oauth2.token": "gcs-secret",
        },
    )
    conf = {**spark_catalog_conf(settings), **spark_storage_conf(settings)}
    redaction = re.compile(f"(?i){SECRET_KEY_PATTERN}")
    secrets = {"pg-secret", "store-secret", "AKIDEXAMPLE", "sess-secret", "oauth-secret", "bearer-secret",
               "header-secret", "adls-secret", "sas-secret", "gcs-secret"}  # fmt: skip
    for key, value in conf.items():
        if any(secret in value for secret in secrets):
            assert redaction.search(key), f"{key} carries a secret but Spark would not redact it"
    found = {secret for secret in secrets for value in conf.values() if secret in value}
    assert found == secrets  # every secret reached Spark, each under a redacted key


def test_a_rest_catalogs_url_credentials_and_api_key_header_never_reach_spark_in_clear() -> None:
    """Issue 24 item 7: Spark hides a conf entry when spark.redaction.regex matches its key or its
    value; a REST URI's user info goes to Iceberg's basic auth properties, an API key header is secret."""
    settings = CatalogSettings(
        name="c",
        type="rest",
        uri="https://rest-user:rest-pw@catalog.example/api",
        **{"header.X-Api-Key": "ak-7f3d9e", "header.X-Client-Version": "1.0"},
    )
    conf = {**spark_catalog_conf(settings), **spark_storage_conf(settings)}
    redaction = re.compile(f"(?i){SECRET_KEY_PATTERN}")
    shown = {k: v for k, v in conf.items() if not (redaction.search(k) or redaction.search(v))}
    assert not [k for k, v in shown.items() if "rest-pw" in v or "ak-7f3d9e" in v], shown
    assert conf["spark.sql.catalog.c.uri"] == "https://catalog.example/api"
    assert conf["spark.sql.catalog.c.rest.auth.type"] == "basic"
    assert conf["spark.sql.catalog.c.rest.auth.basic.username"] == "rest-user"
    assert conf["spark.sql.catalog.c.rest.auth.basic.password"] == "rest-pw"
    # Every header is hidden: a secret may hide under any header name (issue 33 item 6).
    assert not [k for k in shown if ".header." in k], shown
    # A value with credentials in a URL is hidden by value, whatever its key.
    assert redaction.search("jdbc:postgresql://u:pw@h/db") and not redaction.search("https://h/db")
    assert redaction.search("https://TOKEN@h/db") and redaction.search("postgresql://u:p/w@h/db")
    assert not redaction.search("s3://bucket/key@v2") and not redaction.search("jdbc:postgresql://h:5432/db")


def test_a_rest_uri_whose_password_holds_a_slash_goes_to_basic_auth_whole() -> None:
    """Issue 33 item 6: ``urlsplit`` cut such a URI at the slash, leaving the password's tail in the
    URI Spark shows and its head in an error about the port."""
    settings = CatalogSettings(
        name="c", type="rest", uri="https://rest-user:re/st:pw@catalog.example:8181/api"
    )
    conf = spark_catalog_conf(settings)
    assert conf["spark.sql.catalog.c.uri"] == "https://catalog.example:8181/api"
    assert conf["spark.sql.catalog.c.rest.auth.basic.username"] == "rest-user"
    assert conf["spark.sql.catalog.c.rest.auth.basic.password"] == "re/st:pw"


# --------------------------------------------------------------------------------------------
# PyIceberg's own configuration


def _write_pyiceberg_yaml(folder: Path, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".pyiceberg.yaml").write_text(text)


def _sink(catalog: dict[str, Any]) -> dict[str, Any]:
    return {"name": "s", "source": {"topics": ["t"]}, "tables": {"a.b": {}}, "catalog": catalog}


def test_catalog_named_in_pyiceberg_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "pyiceberg-home"
    _write_pyiceberg_yaml(
        home,
        "catalog:\n  prod:\n    uri: http://127.0.0.1:19120/iceberg\n    s3.endpoint: http://127.0.0.1:9000\n"
        "    warehouse: s3://lake/\n    ssl:\n      cabundle: /etc/ca.pem\n",
    )
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    config = parse_config(_sink({"name": "prod"}), "sink.yaml")
    catalog = config.catalog
    # No type in the file: PyIceberg's own inference from the URI, never our `sql` default.
    assert (catalog.type, catalog.uri, catalog.warehouse) == (
        "rest",
        "http://127.0.0.1:19120/iceberg",
        "s3://lake/",
    )
    assert catalog.properties()["s3.endpoint"] == "http://127.0.0.1:9000"
    assert "ssl" not in catalog.properties()  # a nested block stays PyIceberg's own
    assert spark_catalog_conf(catalog)["spark.sql.catalog.prod.type"] == "rest"


def test_yaml_keys_override_pyiceberg_config_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "pyiceberg-home"
    _write_pyiceberg_yaml(
        home, "catalog:\n  prod:\n    type: rest\n    uri: http://file-uri\n    warehouse: from-file\n"
    )
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    monkeypatch.setenv("PYICEBERG_CATALOG__PROD__URI", "http://env-uri")
    monkeypatch.setenv("PYICEBERG_CATALOG__PROD__S3__ACCESS_KEY_ID", "env-key")
    catalog = parse_config(_sink({"name": "prod", "warehouse": "from-sink-yaml"}), "sink.yaml").catalog
    assert catalog.type == "rest"
    assert catalog.uri == "http://env-uri"  # PyIceberg's rule: the variable beats its file
    assert catalog.warehouse == "from-sink-yaml"  # our YAML beats both
    assert catalog.properties()["s3.access-key-id"] == "env-key"


def test_catalog_only_in_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYICEBERG_CATALOG__ENVCAT__URI", "postgresql+psycopg2://u:pw@h:5432/db")
    catalog = parse_config(_sink({"name": "envcat"}), "sink.yaml").catalog
    assert (catalog.type, catalog.uri) == ("sql", "postgresql+psycopg2://u:pw@h:5432/db")
    assert java_catalog_properties(catalog)["uri"] == "jdbc:postgresql://h:5432/db"


def test_default_sql_only_when_the_name_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "pyiceberg-home"
    _write_pyiceberg_yaml(home, "catalog:\n  other:\n    type: rest\n    uri: http://r\n")
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    catalog = parse_config(_sink({"name": "lake", "uri": "sqlite:///c.db"}), "sink.yaml").catalog
    assert (catalog.type, catalog.uri) == ("sql", "sqlite:///c.db")
    assert "other" not in str(catalog.properties())


def test_pyiceberg_catalog_without_uri_or_type_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "pyiceberg-home"
    _write_pyiceberg_yaml(home, "catalog:\n  prod:\n    warehouse: s3://w/\n")
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    with pytest.raises(ConfigError, match="catalog"):
        parse_config(_sink({"name": "prod"}), "sink.yaml")


def test_sink_checkpoint_location_keeps_uri_schemes() -> None:
    def location(base: str | None) -> str:
        spark = {"checkpoint-location": base} if base else {}
        return parse_config(
            {**_sink({"name": "lake", "uri": "sqlite:///c.db"}), "spark": spark}, "x"
        ).checkpoint_location

    assert location("s3a://bucket/checkpoints") == "s3a://bucket/checkpoints/s"
    assert location("s3a://bucket/checkpoints/") == "s3a://bucket/checkpoints/s"
    assert location("hdfs://nn:8020/ck") == "hdfs://nn:8020/ck/s"
    assert location("file:///var/ck") == "file:///var/ck/s"
    assert location("/var/ck") == "/var/ck/s"
    assert location(None) == str(Path(".") / ".fanout-sink" / "checkpoints" / "s")


def _sink_yaml(folder: Path, uri: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sink.yaml"
    path.write_text(
        "name: rel\nsource: {topics: [t]}\ntables: {a.b: {}}\nspark: {checkpoint-location: ck}\n"
        f'catalog: {{name: lake, type: sql, uri: "{uri}", warehouse: "file://{folder}/wh"}}\n'
    )
    return path


def test_a_relative_sqlite_path_is_relative_to_the_yaml_not_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``schema:`` was relative to the YAML and ``catalog.uri`` to the working folder: the shipped
    examples, run from another folder, found (and made) another catalog (issue 49)."""
    config_file = _sink_yaml(tmp_path / "configs", "sqlite:///warehouse/catalog.db")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(config_file)
    expected = tmp_path / "configs" / "warehouse" / "catalog.db"
    assert config.catalog.uri == f"sqlite:///{expected}"
    assert jdbc_catalog_properties(config.catalog.uri) == {"uri": f"jdbc:sqlite:{expected}"}
    assert config.checkpoint_location == str(tmp_path / "configs" / "ck" / "rel")  # the same rule
    # The demo's copy of a config lives in another folder: it names the same file.
    copy = write_standalone_copy(config_file, tmp_path / "copy.yaml", [])
    assert load_config(copy).catalog.uri == f"sqlite:///{expected}"
    absolute = _sink_yaml(tmp_path / "abs", f"sqlite:///{tmp_path}/cat.db")
    assert load_config(absolute).catalog.uri == f"sqlite:///{tmp_path}/cat.db"  # an absolute one stays


def test_only_run_creates_a_catalog_read_only_commands_name_the_path_they_looked_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in a SQLite catalog's path made ``maintain`` (and ``status``, ``sql``) create an empty
    catalog and answer as if the sink had no table (issue 49): read-only loading refuses it."""
    config_file = _sink_yaml(tmp_path, "sqlite:///warehuose/catalog.db")
    missing = tmp_path / "warehuose" / "catalog.db"
    with pytest.raises(CatalogNotFoundError, match=re.escape(str(missing))):
        load_catalog(load_config(config_file).catalog, create=False)
    assert main(["maintain", "--config", str(config_file), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fanout-sink: catalog 'lake': {missing} does not exist;"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not missing.parent.exists(), "a read-only command created the catalog's folder"
