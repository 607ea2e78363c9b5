"""One Iceberg catalog seen from two engines: PyIceberg on the sink's side, Spark SQL on the reader's.

The user writes the ``catalog:`` section once, with PyIceberg's property names (or names a catalog of
their ``.pyiceberg.yaml``); the Spark side is derived from the same properties here, so both engines
reach the same catalog and the same files:

- SQL catalog -> Iceberg's JDBC catalog. Both key their rows by the catalog name, so it is registered
  in Spark under the same name. A SQLAlchemy URI becomes a JDBC URI without its driver suffix and
  without its credentials, which go to ``jdbc.user``/``jdbc.password`` (a JDBC URI is logged in
  places where a property is redacted).
- REST, Hive, Glue: the type and the properties pass through; PyIceberg and Iceberg Java share the
  REST names (``credential``, ``token``, ``oauth2-server-uri``, ``scope``, ``audience``,
  ``resource``, ``warehouse``, ``prefix``, ``header.*``, ``rest.sigv4-enabled``, ``rest.signing-*``).
- Storage: PyIceberg's S3 names become Iceberg's ``S3FileIO`` properties, and the same endpoint and
  keys configure Hadoop's ``s3a`` for a checkpoint on the object store (:func:`spark_storage_conf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fanout_sink.errors import CatalogNotFoundError, FanoutSinkError
from fanout_sink.user_info import split_user_info

_SQLITE_PREFIX = "sqlite:///"
PY_IO_IMPL = "py-io-impl"
"""PyIceberg's catalog property naming the FileIO class; a user's choice is kept."""
PY_CATALOG_IMPL = "py-catalog-impl"
HIVE_CATALOG_IMPL = "fanout_sink.pyiceberg_internals.hive.ThreadSafeHiveCatalog"
"""A ``type: hive`` catalog's class: PyIceberg's HiveCatalog with one thrift connection per thread."""
DURABLE_FILE_IO = "fanout_sink.pyiceberg_internals.fileio.DurableFileIO"
DEFAULT_CATALOG_NAME = "lake"
DEFAULT_CATALOG_TYPE = "sql"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
_S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def is_s3_location(location: str | None) -> bool:
    """An ``s3://``, ``s3a://`` or ``s3n://`` location (a warehouse, a checkpoint)."""
    return location is not None and location.startswith(_S3_SCHEMES)


class CatalogSettings(BaseModel):
    """The ``catalog:`` section: Iceberg catalog property names, passed through as they are.

    A catalog of the same name in PyIceberg's own configuration (``.pyiceberg.yaml`` or
    ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables) is the base and the keys given here override
    its keys, so ``catalog: {name: prod}`` alone uses that catalog. The default ``type: sql`` applies
    only when no such catalog exists. The merged properties travel with the settings object (to the
    Spark side and to executors on hosts that have no ``.pyiceberg.yaml``).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    name: str = Field(default=DEFAULT_CATALOG_NAME, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: str = DEFAULT_CATALOG_TYPE
    uri: str | None = None
    warehouse: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _with_pyiceberg_config(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        found = pyiceberg_catalog_properties(str(data.get("name", DEFAULT_CATALOG_NAME)))
        if found is None:
            return data
        merged = {**found, **data}
        if "type" not in merged:
            merged["type"] = _inferred_type(str(data.get("name")), merged)
        return merged

    def properties(self) -> dict[str, str]:
        """Catalog properties as PyIceberg's ``load_catalog`` takes them (every key but ``name``)."""
        props: dict[str, Any] = {"type": self.type, **(self.model_extra or {})}
        if self.uri is not None:
            props["uri"] = self.uri
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        return {key: str(value) for key, value in props.items()}


def pyiceberg_catalog_properties(name: str) -> dict[str, str] | None:
    """Catalog ``name`` from PyIceberg's configuration, read by PyIceberg's own loader (so the file
    lookup — ``$PYICEBERG_HOME``, ``~``, the working folder — and the variable rules are PyIceberg's),
    or None when it defines no such catalog.

    Nested blocks (``ssl:``, ``auth:``) are left out: PyIceberg still reads them from its file on
    the driver, but they cannot travel as flat properties.
    """
    from pyiceberg.utils.config import Config

    found = Config().get_catalog_config(name)
    if found is None:
        return None
    return {str(key): str(value) for key, value in found.items() if not isinstance(value, dict)}


def _inferred_type(name: str, properties: dict[str, Any]) -> str:
    """PyIceberg's own guess from the URI (``http`` -> rest, ``thrift`` -> hive, SQL URIs -> sql)."""
    from pyiceberg.catalog import infer_catalog_type

    inferred = infer_catalog_type(name, properties)
    return inferred.value if inferred is not None else DEFAULT_CATALOG_TYPE


def sqlite_path(uri: str) -> Path | None:
    """The file behind a SQLAlchemy SQLite URI (``sqlite:///rel`` or ``sqlite:////abs``), else None."""
    if not uri.startswith(_SQLITE_PREFIX):
        return None
    return Path(uri[len(_SQLITE_PREFIX) :]).resolve()


def sqlite_uri_under(uri: str, base: Path) -> str:
    """A SQLite URI whose relative path (``sqlite:///warehouse/catalog.db``) is taken under ``base``
    (the YAML's folder, as ``schema:`` paths are); any other URI as it is."""
    if not uri.startswith(_SQLITE_PREFIX):
        return uri
    rest = uri[len(_SQLITE_PREFIX) :]
    if not rest or rest.startswith("/") or rest.startswith(":memory:"):
        return uri
    return f"{_SQLITE_PREFIX}{base.resolve() / rest}"


def load_catalog(settings: CatalogSettings, create: bool = True) -> Any:
    """A PyIceberg catalog; the SQLite file's folder is created so a first run needs no set-up.

    ``create=False`` (``validate`` and every read-only command: ``status``, ``sql``, ``maintain``)
    creates nothing: no folder, no catalog tables, and a SQLite catalog file that does not exist
    raises :class:`CatalogNotFoundError` naming the path (opening it would make an empty catalog,
    which a typo in the path then reads as a sink without tables).
    """
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    from fanout_sink.catalog_errors import check_settings

    # A missing uri or a scheme typo: one line, not PyIceberg's or SQLAlchemy's.
    check_settings(settings.name, settings.type, settings.uri)
    if not create and settings.type == "sql" and settings.uri:
        path = sqlite_path(settings.uri)
        if path is not None and not path.is_file():
            raise CatalogNotFoundError(settings.name, str(path))
    if create and settings.type == "sql" and settings.uri and (path := sqlite_path(settings.uri)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if create and settings.warehouse and settings.warehouse.startswith("file://"):
        Path(settings.warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    if settings.type == "sql" and "@" in (split_user_info(settings.uri or "")[2] or ""):
        raise FanoutSinkError(
            f"catalog {settings.name!r}: the password in catalog.uri holds an unencoded '@': "
            "percent-encode it (%40), or give it as jdbc.password beside the URI"
        )
    properties = settings.properties()
    if settings.type == "sql":
        properties = _with_jdbc_credentials(properties)
    if not create and settings.type == "sql":
        properties["init_catalog_tables"] = "false"
    if local_warehouse_path(settings) is not None and PY_IO_IMPL not in properties:
        # Files a Kafka transaction or a catalog commit names must be on disk first: fsync them.
        properties[PY_IO_IMPL] = DURABLE_FILE_IO
    if settings.type == "hive" and PY_CATALOG_IMPL not in properties:
        # PyIceberg's HiveCatalog shares one thrift connection between threads (pyiceberg_internals/hive.py).
        del properties["type"]
        properties[PY_CATALOG_IMPL] = HIVE_CATALOG_IMPL
    return pyiceberg_load_catalog(settings.name, **properties)


def _with_jdbc_credentials(properties: dict[str, str]) -> dict[str, str]:
    """A SQL catalog's ``jdbc.user``/``jdbc.password`` (Iceberg's names, as Spark's JDBC catalog takes
    them; what ``import-connect`` writes, so that a password of any character needs no encoding and
    stays out of the URI) put into the URI PyIceberg's catalog takes, percent-encoded. User info the
    URI holds itself wins, as on the Spark side (:func:`jdbc_catalog_properties`)."""
    user, password = properties.pop("jdbc.user", None), properties.pop("jdbc.password", None)
    if (user is None and password is None) or not properties.get("uri"):
        return properties
    from sqlalchemy.engine import make_url

    url = make_url(properties["uri"])
    url = url.set(username=url.username or user, password=url.password or password)
    return {**properties, "uri": url.render_as_string(hide_password=False)}


def local_warehouse_path(settings: CatalogSettings) -> Path | None:
    """The warehouse folder when it is on a local or mounted filesystem (files need fsync), else None.

    ``file://`` locations and plain paths count, except that a REST catalog's ``warehouse`` without
    a scheme is the name of a warehouse the server resolves (Polaris, Lakekeeper, Unity and most
    hosted catalogs take a name there), not a folder.
    """
    warehouse = settings.warehouse
    if warehouse is None:
        return None
    if warehouse.startswith("file:"):
        return Path("/" + warehouse[len("file:") :].lstrip("/"))
    if "://" in warehouse or settings.type == "rest":
        return None
    return Path(warehouse)


# --------------------------------------------------------------------------------------------
# The Spark side

_JDBC_DIALECTS = {"postgres": "postgresql"}
"""SQLAlchemy dialect -> JDBC subprotocol where they differ (``postgresql`` and ``mysql`` agree)."""


def jdbc_catalog_properties(uri: str) -> dict[str, str]:
    """Iceberg JDBC catalog properties for a SQLAlchemy URI: ``uri`` plus ``jdbc.user``/``jdbc.password``.

    ``postgresql+psycopg2://user:pw@host:5432/db?sslmode=require`` ->
    ``jdbc:postgresql://host:5432/db?sslmode=require`` (pgjdbc takes libpq's ``sslmode``,
    ``sslrootcert``, ``sslcert`` and ``sslkey`` under the same names). SQLite becomes
    ``jdbc:sqlite:<absolute path>``. Only the SQLite and PostgreSQL drivers ship with the sink.
    """
    path = sqlite_path(uri)
    if path is not None:
        return {"uri": f"jdbc:sqlite:{path}"}
    bare, user, password = split_user_info(uri)
    parts = urlsplit(bare)
    dialect = parts.scheme.split("+", 1)[0]
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    query = f"?{parts.query}" if parts.query else ""
    props = {"uri": f"jdbc:{_JDBC_DIALECTS.get(dialect, dialect)}://{netloc}{parts.path}{query}"}
    if user:
        props["jdbc.user"] = user
    if password is not None:
        props["jdbc.password"] = password
    return props


_PYICEBERG_ONLY = ("py-", "hf.")
"""Properties only PyIceberg reads (its FileIO and catalog classes, Hugging Face): not given to Java."""

_S3_RENAMED = {
    "s3.region": "client.region",
    "client.access-key-id": "s3.access-key-id",
    "client.secret-access-key": "s3.secret-access-key",
    "client.session-token": "s3.session-token",
    "s3.role-arn": "client.assume-role.arn",
    "client.role-arn": "client.assume-role.arn",
    "s3.role-session-name": "client.assume-role.session-name",
    "client.role-session-name": "client.assume-role.session-name",
    "s3.sse-kms-key-id": "s3.sse.key",
    "gcs.endpoint": "gcs.service.host",
    "adls.account-key": "adls.auth.shared-key.account.key",
}
"""PyIceberg name -> Iceberg Java name where they differ and the Java property means the same.

An ``s3.*`` name wins over its ``client.*`` fallback (PyIceberg's order). Everything not named here
or in :func:`java_catalog_properties` passes through unchanged: the two share most names
(``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.session-token``,
``s3.signer.uri``, ``s3.remote-signing-enabled``, ``gcs.project-id``, ``gcs.oauth2.token``,
``gcs.service.host``, ``adls.token``), and a PyIceberg-only one (``s3.proxy-uri``,
``s3.connect-timeout``, ``s3.anonymous``, ``gcs.access``, ``adls.connection-string``, the ``ssl``
and ``auth`` blocks) is ignored by Java.
"""


def _s3_path_style(props: dict[str, str]) -> str | None:
    """Java's ``s3.path-style-access`` matching what pyarrow does with the same properties.

    pyarrow addresses buckets by path whenever an endpoint is given and
    ``s3.force-virtual-addressing`` is not true; the AWS SDK defaults to virtual hosts, which a
    self-hosted store on an IP address cannot serve.
    """
    if "s3.path-style-access" in props:
        return props["s3.path-style-access"]
    forced = props.get("s3.force-virtual-addressing")
    if forced is not None:
        return str(forced.lower() not in {"true", "1", "yes"}).lower()
    return "true" if props.get("s3.endpoint") else None


def uses_s3(props: dict[str, str]) -> bool:
    """Whether the catalog's files are on S3: an ``s3://`` warehouse or any S3 property."""
    return is_s3_location(props.get("warehouse")) or any(key.startswith("s3.") for key in props)


def _uri_properties(kind: str | None, uri: str, props: dict[str, str]) -> dict[str, str]:
    """A REST URI's user info as Iceberg Java's basic auth (``rest.auth.basic.*``, names Spark
    redacts), and the URI without it: a password must not sit in a value Spark shows."""
    bare, user, password = split_user_info(uri)
    if kind != "rest" or password is None or "rest.auth.type" in props:
        return {"uri": uri}
    return {
        "uri": bare,
        "rest.auth.type": "basic",
        "rest.auth.basic.username": user or "",
        "rest.auth.basic.password": password,
    }


def _rest_auth_type(kind: str | None, props: dict[str, str]) -> dict[str, str]:
    """``rest.auth.type=oauth2`` when a REST catalog has a ``credential`` (OAuth2 client
    credentials, ``client_id:client_secret``) or a bearer ``token``: what Iceberg Java infers then
    anyway, said outright so that its start does not log a warning asking for it."""
    if kind != "rest" or "rest.auth.type" in props or props.get("rest.sigv4-enabled", "").lower() == "true":
        return {}
    return {"rest.auth.type": "oauth2"} if "credential" in props or "token" in props else {}


def java_catalog_properties(settings: CatalogSettings) -> dict[str, str]:
    """The catalog's properties with Iceberg Java's names (see :data:`_S3_RENAMED` for what changes)."""
    props = settings.properties()
    out: dict[str, str] = {}
    for key, value in props.items():
        if key.startswith(_PYICEBERG_ONLY) or key in {"type", "uri", "s3.force-virtual-addressing"}:
            continue
        renamed = _S3_RENAMED.get(key, key)
        if renamed != key and renamed in props:
            continue  # the Java name is given as such, or the s3.* name beats its client.* fallback
        if key.startswith("client.") and renamed != key and f"s3.{key[len('client.') :]}" in props:
            continue
        out[renamed] = value
    if settings.type == "sql":
        out["type"] = "jdbc"
        out.update(jdbc_catalog_properties(settings.uri or ""))
    else:
        out["type"] = settings.type
        if settings.uri is not None:
            out.update(_uri_properties(settings.type, settings.uri, out))
        out.update(_rest_auth_type(settings.type, out))
    if "s3.sse-kms-key-id" in props and "s3.sse.type" not in props:
        out["s3.sse.type"] = "kms"
    if "client.assume-role.arn" in out:
        out.setdefault("client.factory", "org.apache.iceberg.aws.AssumeRoleAwsClientFactory")
        if "client.region" in out:
            out.setdefault("client.assume-role.region", out["client.region"])
    if "adls.account-name" in props:
        account = props["adls.account-name"]
        if "adls.auth.shared-key.account.key" in out:
            out["adls.auth.shared-key.account.name"] = account
        if "adls.sas-token" in out:  # Java keys a SAS token by the account's host
            out[f"adls.sas-token.{account}.dfs.core.windows.net"] = out.pop("adls.sas-token")
    if uses_s3(props):
        out.setdefault("io-impl", S3_FILE_IO)
        path_style = _s3_path_style(props)
        if path_style is not None:
            out["s3.path-style-access"] = path_style
    return out


def spark_catalog_conf(settings: CatalogSettings) -> dict[str, str]:
    """Spark properties registering the same catalog in Spark SQL under the same name."""
    prefix = f"spark.sql.catalog.{settings.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    for key, value in java_catalog_properties(settings).items():
        conf[f"{prefix}.{key}"] = value
    return conf


_S3A_CREDENTIALS = {
    "s3.access-key-id": "access.key",
    "s3.secret-access-key": "secret.key",
    "s3.session-token": "session.token",
}


def spark_storage_conf(settings: CatalogSettings) -> dict[str, str]:
    """Hadoop ``s3a`` properties (``spark.hadoop.fs.s3a.*``) from the catalog's S3 properties.

    Spark's checkpoint is written through Hadoop's FileSystem, not Iceberg's FileIO: a checkpoint
    location ``s3a://bucket/path`` (or ``s3://``, mapped to the same S3A class) then reaches the
    same store with the same keys. Empty when the catalog does not use S3.
    """
    props = java_catalog_properties(settings)
    if props.get("io-impl") != S3_FILE_IO:
        return {}
    prefix = "spark.hadoop.fs.s3a."
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = props.get("s3.endpoint")
    if endpoint:
        conf[f"{prefix}endpoint"] = endpoint
        conf[f"{prefix}connection.ssl.enabled"] = str(not endpoint.startswith("http://")).lower()
    if "s3.path-style-access" in props:
        conf[f"{prefix}path.style.access"] = props["s3.path-style-access"]
    if "client.region" in props:
        conf[f"{prefix}endpoint.region"] = props["client.region"]
    for source, target in _S3A_CREDENTIALS.items():
        if source in props:
            conf[prefix + target] = props[source]
    if "s3.session-token" in props:
        conf[f"{prefix}aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    elif "s3.access-key-id" in props:
        conf[f"{prefix}aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf
