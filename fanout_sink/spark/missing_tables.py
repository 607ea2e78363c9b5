"""``fanout-sink sql``'s answer to a mistyped table or namespace, from the catalog alone.

Spark answers ``SELECT * FROM shop.ordrs`` after its session started (8-17 s) with its analysis text:
the logical plan and a hint about views. The catalog can answer sooner and better: the table does not
exist, and these are the tables of that namespace (or, for a mistyped namespace, the namespaces). So
before a query runs, the qualified names it reads (after ``FROM`` and ``JOIN``) are looked up through
PyIceberg; before the first statement, that is before Spark starts.

Only names the catalog can judge are looked up: qualified ones (``ns.table``, ``<catalog>.ns.table``,
a metadata table such as ``ns.table.snapshots``) in statements that only read (``SELECT``, ``WITH``,
``FROM``, ``TABLE``). A bare name may be a common table expression or a temporary view, and a name
of another catalog is Spark's to resolve; those, and any name when the catalog cannot be asked, are
left to Spark, whose error is printed as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from pyiceberg.catalog import Catalog

METADATA_TABLES = frozenset(
    {
        "all_data_files", "all_delete_files", "all_entries", "all_files", "all_manifests", "data_files",
        "delete_files", "entries", "files", "history", "manifests", "metadata_log_entries", "partitions",
        "position_deletes", "refs", "snapshots",
    }
)  # fmt: skip
"""Iceberg's metadata tables: ``ns.table.<one of these>`` reads table ``ns.table``."""

LISTED = 20
"""At most this many names are listed in an answer."""

_QUERY_START = re.compile(r"\s*\(?\s*(select|with|from|table)\b", re.IGNORECASE)
_NOISE = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"", re.DOTALL)
_PART = r"(?:`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)"
_NAME = re.compile(rf"\b(?:from|join)\s+({_PART}(?:\s*\.\s*{_PART})*)(?![\w`])(?!\s*[.(])", re.IGNORECASE)
_PARTS = re.compile(_PART)


def read_names(statement: str) -> list[tuple[str, ...]]:
    """The qualified names a query reads after ``FROM`` and ``JOIN``, as written (backticks removed);
    nothing for a statement that is not a query."""
    if not _QUERY_START.match(_NOISE.sub(" ", statement)):
        return []
    text = _NOISE.sub(" ", statement)
    names = []
    for match in _NAME.finditer(text):
        parts = tuple(
            part[1:-1].replace("``", "`") if part.startswith("`") else part
            for part in _PARTS.findall(match.group(1))
        )
        if len(parts) > 1:
            names.append(parts)
    return names


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:LISTED])
    more = len(names) - LISTED
    return f"{shown} and {more} more" if more > 0 else (shown or "none")


def _table_of(name: tuple[str, ...], catalog_name: str) -> tuple[str, ...] | None:
    """The catalog identifier ``name`` reads, without this catalog's prefix or a metadata table's
    suffix; None for a name of another catalog."""
    if name[0] == catalog_name:
        name = name[1:]
    elif name[0] in ("spark_catalog", "system"):
        return None
    if len(name) > 2 and name[-1].lower() in METADATA_TABLES:
        name = name[:-1]
    return name if len(name) > 1 else None


def missing_table(catalog: Catalog, catalog_name: str, name: tuple[str, ...]) -> str | None:
    """Why ``name`` names no table of ``catalog``, with the tables of its namespace (or the
    namespaces when that is missing too); None when it exists, is a view, or is not the catalog's."""
    identifier = _table_of(name, catalog_name)
    if identifier is None or catalog.table_exists(identifier):
        return None
    try:
        if catalog.view_exists(identifier):
            return None
    except NotImplementedError:  # a catalog without views
        pass
    written = ".".join(name)
    namespace = identifier[:-1]
    if catalog.namespace_exists(namespace):
        tables = sorted(".".join(t) for t in catalog.list_tables(namespace))
        return (
            f"table {written} does not exist; the tables of namespace {'.'.join(namespace)}: "
            f"{_listed(tables)}"
        )
    spaces = sorted(".".join(n) for n in catalog.list_namespaces(namespace[:-1]))
    where = f" in {'.'.join(namespace[:-1])}" if len(namespace) > 1 else ""
    return (
        f"namespace {'.'.join(namespace)} does not exist (table {written}); "
        f"the namespaces{where}: {_listed(spaces)}"
    )


def checker(load: Callable[[], Catalog], catalog_name: str) -> Callable[[str], str | None]:
    """A check of one statement: the answer for the first name it reads that is no table of the
    catalog (loaded by ``load`` on first need), or None. A catalog that cannot be asked answers
    None: Spark then reports what it finds."""
    loaded: list[Catalog] = []

    def check(statement: str) -> str | None:
        names = read_names(statement)
        if not names:
            return None
        try:
            if not loaded:
                loaded.append(load())
            for name in names:
                answer = missing_table(loaded[0], catalog_name, name)
                if answer is not None:
                    return answer
        except Exception:  # the catalog unreachable or refusing: Spark's own error follows
            return None
        return None

    return check
