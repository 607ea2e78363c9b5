"""Which configuration keys name secrets, and copies of settings with their values hidden.

The same pattern serves the config's ``repr`` (:meth:`~fanout_sink.config.models.SinkConfig.redacted`),
the logs and Spark's own redaction (it is a valid Java regex as well).
"""

from __future__ import annotations

import re
from typing import Any

URL_CREDENTIALS_PATTERN = r"(://[^/@:\s]*:)[^/@\s]+@"
"""A URL whose user info holds a password (``https://user:password@host``); the group is what
stays when the password is masked."""
SECRET_KEY_PATTERN = (
    r"(password|passwd|secret|token|credential|private[._-]?key|account[._-]?key|api[._-]?key|"
    r"basic\.auth\.user\.info|sasl\.jaas\.config|access[._-]?key|key[._-]?pem|keystore[._-]?key|authorization|"
    + URL_CREDENTIALS_PATTERN
    + ")"
)
"""What names a secret, case-insensitively; also valid as a Java regex (Spark's redaction takes it,
and matches it against each conf entry's key and value). ``authorization`` and ``api-key`` cover a
REST catalog's ``header.Authorization`` and ``header.X-Api-Key``; the URL alternative catches a
password in any value's URL (a catalog or registry URI) whatever its key."""
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN, re.IGNORECASE)
_URL_PASSWORD = re.compile(URL_CREDENTIALS_PATTERN)
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """Whether a property key names a secret (SASL/SSL passwords, registry credentials, store keys)."""
    return bool(_SECRET_KEY.search(key))


def redact_url(value: str) -> str:
    """``value`` with the password of every URL in it shown as ``***`` (the user name stays)."""
    return _URL_PASSWORD.sub(rf"\1{REDACTED}@", value)


def redact(data: Any) -> Any:
    """A copy of nested dicts/lists with the values of secret keys replaced by ``***``, and the
    passwords inside URLs anywhere else too."""
    if isinstance(data, dict):
        return {
            k: REDACTED if is_secret_key(str(k)) and v is not None else redact(v) for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact(v) for v in data]
    if isinstance(data, str):
        return redact_url(data)
    return data


# --------------------------------------------------------------------------------------------
