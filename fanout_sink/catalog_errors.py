"""What is wrong with a catalog, in one line: before it is loaded (:func:`check_settings`: no URI, and
where PyIceberg looked for a catalog of that name; a URI scheme no engine knows) and when it does not
answer (:func:`unreachable`: the cause, not the HTTP library's nested repr).

Without these a typo in ``sqlite://`` read "is not reachable: NoSuchModuleError: Can't load plugin",
``catalog: {name: prod}`` without a ``.pyiceberg.yaml`` that defines ``prod`` did not say which files
were searched, and a REST catalog that refused the connection printed urllib3's 300-character repr.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from fanout_sink.errors import CatalogSettingsError
from fanout_sink.user_info import redact_url

URI_EXAMPLES = {
    "sql": "sqlite:////var/lib/fanout-sink/catalog.db for the embedded SQL catalog",
    "rest": "http://iceberg-rest:8181 (the REST catalog's base URL)",
    "hive": "thrift://metastore:9083",
}
SCHEMES = {"rest": ("http", "https"), "hive": ("thrift",)}
"""The URI schemes of the catalogs whose server speaks one protocol."""
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_LONGEST = 300
"""A cause longer than this is cut: the line is for a person, the rest is at DEBUG."""


def pyiceberg_lookup(name: str) -> str:
    """Where PyIceberg looked for catalog ``name`` (its search order: ``$PYICEBERG_HOME``, the home
    folder, the working folder; first file found wins; then ``PYICEBERG_CATALOG__*`` variables)."""
    from pyiceberg.utils.config import PYICEBERG_HOME, PYICEBERG_YML, Config

    home = os.environ.get(PYICEBERG_HOME)
    folders = [Path(home)] if home else []
    folders += [Path.home(), Path.cwd()]
    found = next((folder / PYICEBERG_YML for folder in folders if (folder / PYICEBERG_YML).is_file()), None)
    variables = f"nor PYICEBERG_CATALOG__{name.upper()}__* variables"
    if found is not None:
        known = Config().get_known_catalogs()
        return f"{found} defines no catalog {name!r} (it has: {', '.join(known) or 'none'}), {variables}"
    searched = ", ".join(str(folder / PYICEBERG_YML) for folder in folders)
    unset = "" if home else f" (${PYICEBERG_HOME} is not set)"
    return f"no {PYICEBERG_YML} found (looked for {searched}{unset}), {variables}"


def check_settings(name: str, kind: str, uri: str | None) -> None:
    """:class:`CatalogSettingsError` when the ``catalog:`` section (``name``, ``type``, ``uri``) cannot
    name a catalog: a SQL, REST or Hive catalog without ``uri``, or a ``uri`` whose scheme that
    catalog type does not speak."""
    if uri is None:
        if kind in URI_EXAMPLES:
            raise CatalogSettingsError(
                f"catalog.uri is not set: the {kind} catalog {name!r} needs one; {pyiceberg_lookup(name)}",
                f"set catalog.uri, e.g. {URI_EXAMPLES[kind]}, or define catalog {name!r} in a "
                ".pyiceberg.yaml there",
            )
        return
    scheme = urlsplit(uri).scheme
    if kind == "sql":
        from sqlalchemy.dialects import __all__ as dialects
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            make_url(uri).get_dialect()
        except ValueError:  # a malformed rest of the URI (a port, user info): the loader says what
            return
        except (ArgumentError, NoSuchModuleError):
            named = f"scheme {scheme!r}" if scheme else "no scheme"
            raise CatalogSettingsError(
                f"catalog.uri {redact_url(uri)}: {named} is no SQL database SQLAlchemy knows "
                f"(known: {', '.join(sorted(dialects))}, each with an optional +driver)",
                f"correct the scheme, e.g. {URI_EXAMPLES['sql']}, or postgresql+psycopg2://user@host/db",
            ) from None
    elif kind in SCHEMES and scheme not in SCHEMES[kind]:
        raise CatalogSettingsError(
            f"catalog.uri {redact_url(uri)}: a {kind} catalog's URI starts with "
            f"{' or '.join(s + '://' for s in SCHEMES[kind])}, not {scheme or 'no scheme'}",
            f"correct catalog.uri, e.g. {URI_EXAMPLES[kind]}",
        )


def unreachable(error: BaseException) -> str:
    """One line for a catalog that did not answer: for a connection that failed, the URL and the
    operating system's reason (``Connection refused``, ``Name or service not known``); otherwise the
    exception's type and first line."""
    import requests

    if isinstance(error, requests.exceptions.ConnectionError):
        url = error.request.url if error.request is not None else None
        where = f" {redact_url(str(url))}" if url else ""
        if isinstance(error, requests.exceptions.ConnectTimeout):
            return f"no answer from{where} within the connect timeout"
        reason = _ERRNO.search(str(error))
        return f"cannot connect to{where}: {reason.group(1).strip() if reason else type(error).__name__}"
    first = (str(error).strip().splitlines() or [""])[0]
    text = f"{type(error).__name__}: {redact_url(first)}" if first else type(error).__name__
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."
