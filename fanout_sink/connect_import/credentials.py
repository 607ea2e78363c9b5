"""The connector's credentials in the imported sink YAML: named, never written, never printed.

A connector config holds secrets in plain text (``iceberg.catalog.jdbc.password``,
``iceberg.kafka.sasl.password``, ...) or as Connect config-provider references (``${file:<path>:<key>}``,
``${env:<VAR>}``) that only Connect's worker resolves. Both become ``${VAR}`` references in the YAML,
which the sink's loader substitutes at start (``config/loading.py``); the import names each variable
and the connector key it stands for (:class:`References`). The JDBC catalog's URI becomes
SQLAlchemy's without user info: the user and password go beside it as Iceberg's ``jdbc.user`` and
``jdbc.password``, so a password of any character needs no encoding (``catalog.load_catalog`` puts
them into PyIceberg's URI percent-encoded, and Spark's JDBC catalog takes them under those names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from fanout_sink.config.secrets import is_secret_key
from fanout_sink.errors import FanoutSinkError
from fanout_sink.user_info import redact_url

_PROVIDER_REF = re.compile(r"\$\{[A-Za-z0-9_.-]+:[^}]*\}")
"""A Connect config-provider reference: ``${provider:[path:]key}`` (KIP-297)."""
_ENV_REF = re.compile(r"\$\{env::?([A-Za-z_][A-Za-z0-9_]*)\}")
"""Kafka's ``EnvVarConfigProvider`` reference to one variable: the sink's own ``${VAR}`` then."""
_LIBPQ_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
"""pgjdbc URI parameters psycopg2 (libpq) takes under the same names (``catalog.jdbc_catalog_properties``)."""
JDBC_PASSWORD = "iceberg.catalog.jdbc.password"


class ImportError_(FanoutSinkError):
    """A connector config the sink cannot take, naming the key (and never a secret's value)."""


def variable_name(key: str) -> str:
    """The environment variable a connector key's value is read from: ``iceberg.kafka.sasl.password``
    -> ``ICEBERG_KAFKA_SASL_PASSWORD``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_").upper()


@dataclass
class References:
    """The connector's properties with every secret and config-provider reference replaced by a
    ``${VAR}`` reference: ``provided`` (key -> Connect's reference, which the import cannot read
    where it must parse the value) and ``variables`` (VAR -> the connector key it stands for)."""

    props: dict[str, str]
    provided: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)

    def refer(self, key: str, name: str | None = None) -> str:
        var = name or variable_name(key)
        self.variables.setdefault(var, key)
        return f"${{{var}}}"

    def parsed(self, key: str) -> None:
        """Refuses a key the import must read the value of when Connect resolves it."""
        if key in self.provided:
            raise ImportError_(
                f"{key}: {self.provided[key]} is a Connect config provider reference, resolved by "
                "Connect's worker only, and the import must read this value: put the value itself in "
                "the config given to the import"
            )

    def written(self, text: str) -> dict[str, str]:
        """The variables the written YAML refers to, in the order they were named."""
        return {var: key for var, key in self.variables.items() if f"${{{var}}}" in text}


def as_references(props: dict[str, str]) -> References:
    """``props`` with each secret value (a key :func:`is_secret_key` names, or a URL holding user
    info) and each Connect config-provider reference replaced by a ``${VAR}`` reference."""
    refs = References(dict(props))
    for key, value in props.items():
        if _PROVIDER_REF.search(value):
            env = _ENV_REF.fullmatch(value.strip())
            refs.provided[key] = value
            refs.props[key] = refs.refer(key, env.group(1) if env else None)
        elif value and (is_secret_key(key) or (not value.startswith("jdbc:") and redact_url(value) != value)):
            refs.props[key] = refs.refer(key)
    return refs


def sqlalchemy_catalog(
    uri: str, user: str | None, password: str | None, refs: References
) -> tuple[dict[str, str], list[str]]:
    """A JDBC catalog URI as the sink's ``catalog:`` entries (SQLAlchemy's ``uri``, ``jdbc.user``,
    ``jdbc.password``) and the URI's parameters not carried. The user and password come from
    ``iceberg.catalog.jdbc.*`` (``password`` is already a reference) or else from the URI's own
    ``user``/``password`` parameters; an error repeats no part of the URI but its subprotocol."""
    if uri.startswith("jdbc:sqlite:"):
        path = uri.removeprefix("jdbc:sqlite:").removeprefix("file:")
        return {
            "uri": f"sqlite:///{path.lstrip('/')}" if not path.startswith("/") else f"sqlite:///{path}"
        }, []
    match = re.fullmatch(r"jdbc:postgresql://([^/?]+)([^?]*)(?:\?(.*))?", uri)
    if match is None:
        subprotocol = uri.split(":", 2)[1] if uri.startswith("jdbc:") and ":" in uri[5:] else "?"
        raise ImportError_(
            f"iceberg.catalog.uri: a jdbc:{subprotocol}: URI has no PyIceberg SQL catalog the sink ships; "
            "only SQLite (jdbc:sqlite:) and PostgreSQL (jdbc:postgresql://) do"
        )
    host, path, query = (
        match.group(1),
        match.group(2),
        parse_qsl(match.group(3) or "", keep_blank_values=True),
    )
    kept = [(name, value) for name, value in query if name in _LIBPQ_PARAMETERS]
    params = dict(query)
    if user is None and params.get("user"):
        user = params["user"]
    if password is None and params.get("password"):
        password = refs.refer("iceberg.catalog.uri (its password parameter)", variable_name(JDBC_PASSWORD))
    dropped = [
        name for name, _ in query if name not in _LIBPQ_PARAMETERS and name not in ("user", "password")
    ]
    catalog = {"uri": f"postgresql+psycopg2://{host}{path}" + (f"?{urlencode(kept)}" if kept else "")}
    if user:
        catalog["jdbc.user"] = user
    if password:
        catalog["jdbc.password"] = password
    return catalog, dropped
