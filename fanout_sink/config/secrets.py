"""Which configuration keys name secrets, and copies of settings with their values hidden.

The same pattern serves the config's ``repr`` (:meth:`~fanout_sink.config.models.SinkConfig.redacted`),
the logs and Spark's own redaction (it is a valid Java regex as well).
"""

from __future__ import annotations

import re
from typing import Any

from fanout_sink.user_info import REDACTED, URL_USER_INFO_PATTERN, redact_url

SECRET_KEY_PATTERN = (
    r"(password|passwd|secret|token|credential|private[._-]?key|account[._-]?key|api[._-]?key|"
    r"basic\.auth\.user\.info|sasl\.jaas\.config|access[._-]?key|key[._-]?pem|keystore[._-]?key|authorization|"
    r"header\.|" + URL_USER_INFO_PATTERN + ")"
)
"""What names a secret, case-insensitively; also valid as a Java regex (Spark's redaction takes it,
and matches it against each conf entry's key and value). ``header.`` covers every header a REST
catalog sends (``header.Authorization``, ``header.X-Auth``, ``header.Cookie``: a secret may hide
under any name); the URL alternative catches user info in any value's URL (a catalog or registry
URI) whatever its key."""
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN, re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """Whether a property key names a secret (SASL/SSL passwords, registry credentials, store keys)."""
    return bool(_SECRET_KEY.search(key))


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
