"""Which configuration keys name secrets, and copies of settings with their values hidden.

The same pattern serves the config's ``repr`` (:meth:`~fanout_sink.config.models.SinkConfig.redacted`),
the logs and Spark's own redaction (it is a valid Java regex as well).
"""

from __future__ import annotations

import re
from typing import Any

SECRET_KEY_PATTERN = (
    r"(password|passwd|secret|token|credential|private[._-]?key|account[._-]?key|"
    r"basic\.auth\.user\.info|sasl\.jaas\.config|access[._-]?key|key[._-]?pem|keystore[._-]?key|authorization)"
)
"""What names a secret, case-insensitively; also valid as a Java regex (Spark's redaction takes it).
``authorization`` covers a REST catalog's ``header.Authorization``."""
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN, re.IGNORECASE)
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """Whether a property key names a secret (SASL/SSL passwords, registry credentials, store keys)."""
    return bool(_SECRET_KEY.search(key))


def redact(data: Any) -> Any:
    """A copy of nested dicts/lists with the values of secret keys replaced by ``***``."""
    if isinstance(data, dict):
        return {
            k: REDACTED if is_secret_key(str(k)) and v is not None else redact(v) for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


# --------------------------------------------------------------------------------------------
