"""A URL's user info: found anywhere in a value, split off a URI, hidden.

Catalog and registry URIs may carry a user and a password (``postgresql://user:password@host/db``)
or a token alone (``https://TOKEN@host``). SQLAlchemy's parsing decides where the password ends (at
the ``@``, so it may hold ``/`` and ``:``); ``urlsplit`` ends the authority at the first ``/``
instead, which would leave a password's tail in the URI and its head in the port.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

URL_USER_INFO_PATTERN = r"://[^/@:\s]*(?::\S*)?@"
"""A URL's user info (user and password, or a token alone); a user name holds no ``/`` or ``:``,
a password anything but spaces, up to the last ``@`` (one typed unencoded, ``p@ss``, is hidden
whole, not up to its ``@``). Also valid as a Java regex (Spark's redaction)."""
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*)(?::(?P<password>\S*))?@")
REDACTED = "***"


def _masked(match: re.Match[str]) -> str:
    if match["password"] is None:  # a token alone: the whole user info is the secret
        return f"{match['scheme']}{REDACTED}@"
    return f"{match['scheme']}{match['user']}:{REDACTED}@"


def redact_url(value: str) -> str:
    """``value`` with the user info of every URL in it hidden: the password as ``***`` (the user
    name stays), a token without a password as ``***``."""
    return _USER_INFO.sub(_masked, value)


def split_user_info(uri: str) -> tuple[str, str | None, str | None]:
    """``uri`` without its user info, and the user and password in it (percent-decoded; ``None``
    when absent)."""
    match = _USER_INFO.match(uri)
    if match is None:
        return uri, None, None
    password = match["password"]
    bare = match["scheme"] + uri[match.end() :]
    return bare, unquote(match["user"]), None if password is None else unquote(password)
