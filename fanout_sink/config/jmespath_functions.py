"""The functions the sink's jmespath expressions may call: jmespath's own plus ``regex(subject,
'pattern')``, and the check on load that an expression calls only those, each with as many arguments
as it takes.

jmespath looks a function up only when it evaluates the call: an unknown name or a wrong argument
count compiles, then raises on every record. In a ``when`` that read as "no match", so every record
was filtered without a word (issue 47 item 5); the config refuses such an expression as it refuses a
syntax error, naming its YAML path. A ``regex`` pattern given as a literal is compiled on load too.
"""

from __future__ import annotations

import re
from typing import Any

import jmespath
from jmespath import functions as jp_functions


class SinkFunctions(jp_functions.Functions):
    """jmespath's functions and ``regex``: true when ``pattern`` matches anywhere in the string
    ``subject`` (false for anything that is not a string)."""

    @jp_functions.signature({"types": []}, {"types": ["string"]})
    def _func_regex(self, subject: Any, pattern: str) -> bool:
        return isinstance(subject, str) and re.search(pattern, subject) is not None


FUNCTIONS = SinkFunctions()
JMESPATH_OPTIONS = jmespath.Options(custom_functions=FUNCTIONS)
"""What every expression of the sink is evaluated with."""

_SPEC = "jmespath.org/specification.html#built-in-functions"


def call_problem(parsed: dict[str, Any]) -> str | None:
    """What is wrong with the first function call in the parsed expression ``parsed`` (an unknown
    function, a wrong argument count, a ``regex`` literal that is no regular expression), or None."""
    if parsed.get("type") == "function_expression":
        problem = _call_problem(parsed["value"], parsed["children"])
        if problem is not None:
            return problem
    for child in parsed.get("children", ()):
        if isinstance(child, dict):  # a slice's children are its numbers
            problem = call_problem(child)
            if problem is not None:
                return problem
    return None


def _call_problem(name: str, args: list[dict[str, Any]]) -> str | None:
    spec = FUNCTIONS.FUNCTION_TABLE.get(name)
    if spec is None:
        return (
            f"calls {name}(), which jmespath does not have; use one of {_SPEC} or regex(subject, 'pattern')"
        )
    signature = spec["signature"]
    wanted = len(signature)
    if signature and signature[-1].get("variadic"):
        if len(args) < wanted:
            return f"{name}() takes at least {_arguments(wanted)}, not {len(args)}"
    elif len(args) != wanted:
        return f"{name}() takes {_arguments(wanted)}, not {len(args)}"
    if name == "regex" and args[1]["type"] == "literal" and isinstance(args[1]["value"], str):
        try:
            re.compile(args[1]["value"])
        except re.error as exc:
            return f"regex() pattern {args[1]['value']!r} is not a regular expression ({exc})"
    return None


def _arguments(count: int) -> str:
    return f"{count} argument" + ("" if count == 1 else "s")
