"""Exception types. Every error the sink raises on purpose says what went wrong and what to do next."""

from __future__ import annotations


class FanoutSinkError(Exception):
    """Base of every error raised by fanout_sink on purpose."""


class StackError(FanoutSinkError):
    """The local stack (jars, JVM, broker) could not be brought up.

    ``cause`` is one line naming what failed; ``fix`` says what the operator should do about it.
    """

    def __init__(self, cause: str, fix: str, details: str = "") -> None:
        self.cause = cause
        self.fix = fix
        self.details = details
        message = f"{cause}\n  fix: {fix}"
        if details:
            message += f"\n{details}"
        super().__init__(message)
