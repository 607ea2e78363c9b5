"""The side-by-side benchmark's records and tables: one generator, so every system sees the same bytes.

A variant is ``uniform`` or ``mixed`` times a table count. Every record carries its route in the
``table`` field (``t0`` .. ``t<N-1>``, the table's own name inside namespace ``bench``), so each
system routes by one field the same way. ``mixed`` gives ``amount`` a different JSON type per
record kind, as the demo's ``orders`` topic does (string on even tables, number on odd ones); in
``uniform`` it is a number everywhere. Each table's columns are exactly the fields its records
carry, with the types their JSON has, because the Connect peer needs its tables created up front.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

NAMESPACE = "bench"
ROUTE_FIELD = "table"
KINDS = ("uniform", "mixed")
_PAGES = ["/", "/search", "/cart", "/checkout", "/product", "/account", "/help"]
_COUNTRIES = ["DE", "FR", "NL", "PL", "SE", "ES", "IT", "US", "GB", "JP"]
_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36",
]
_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Variant:
    """``kind`` is ``uniform`` or ``mixed``; ``tables`` is how many tables the records spread over."""

    kind: str
    tables: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.tables}"

    def table_names(self) -> list[str]:
        """Fully qualified names, ``bench.t0`` ..."""
        return [f"{NAMESPACE}.t{n}" for n in range(self.tables)]

    def amount_is_string(self, table: int) -> bool:
        return self.kind == "mixed" and table % 2 == 0

    def schema(self, table: int) -> Schema:
        """The columns of table ``t<table>``: exactly the fields its records carry."""
        amount = StringType() if self.amount_is_string(table) else DoubleType()
        columns = [
            ("id", StringType()), (ROUTE_FIELD, StringType()), ("seq", LongType()),
            ("session", StringType()), ("page", StringType()), ("country", StringType()),
            ("amount", amount), ("ts", LongType()), ("agent", StringType()),
        ]  # fmt: skip
        return Schema(
            *(NestedField(n + 1, name, kind, required=False) for n, (name, kind) in enumerate(columns))
        )


def parse_variant(text: str) -> Variant:
    """``uniform-3``, ``mixed-50``, ... as the ``--variants`` flag takes them."""
    kind, _, tables = text.partition("-")
    if kind not in KINDS or not tables.isdigit() or int(tables) < 1:
        raise ValueError(f"variant {text!r} is not <uniform|mixed>-<tables>, e.g. uniform-3 or mixed-50")
    return Variant(kind, int(tables))


def value_chunks(
    variant: Variant, records: int, chunk: int = 100_000, seed: int = 11
) -> Iterator[list[bytes]]:
    """``records`` JSON values with unique ids ``r-<n>``, routed round-robin-ish over the tables, in
    lists of at most ``chunk`` (even, so value n still goes to partition n % 2 chunk by chunk): 10M
    records are 2.8 GB as Python bytes, so the benchmark writes and produces them a chunk at a time."""
    for _, chunk_values in routed_chunks(variant, records, chunk, seed):
        yield chunk_values


def routed_chunks(
    variant: Variant, records: int, chunk: int = 100_000, seed: int = 11, qualified: bool = False
) -> Iterator[tuple[list[int], list[bytes]]]:
    """:func:`value_chunks` with each value's table number beside it, so a benchmark knows every
    table's ids without parsing its records back. ``qualified`` puts the whole table name
    (``bench.t7``) in the route field instead of ``t7``: what the Connect peer's dynamic routing
    needs, as it takes the field's value as the table identifier."""
    if chunk % 2:
        raise ValueError(f"chunk {chunk} must be even: chunks keep value n on partition n % 2")
    rng = random.Random(seed)
    prefix = f"{NAMESPACE}." if qualified else ""
    tables: list[int] = []
    out: list[bytes] = []
    for n in range(records):
        table = rng.randrange(variant.tables)
        amount: Any = round(rng.uniform(1, 500), 2)
        record = {
            "id": f"r-{n}",
            ROUTE_FIELD: f"{prefix}t{table}",
            "seq": n,
            "session": f"s-{rng.randrange(1, 20_000):05d}",
            "page": rng.choice(_PAGES),
            "country": rng.choice(_COUNTRIES),
            "amount": f"{amount:.2f}" if variant.amount_is_string(table) else amount,
            "ts": _BASE_MS + n * 7,
            "agent": rng.choice(_AGENTS),
        }
        tables.append(table)
        out.append(json.dumps(record, separators=(",", ":")).encode())
        if len(out) == chunk:
            yield tables, out
            tables, out = [], []
    if out:
        yield tables, out


def values(variant: Variant, records: int, seed: int = 11) -> list[bytes]:
    """All of :func:`value_chunks` in one list (small runs, the latency mode)."""
    return [value for chunk in value_chunks(variant, records, seed=seed) for value in chunk]


def create_tables(catalog: Any, variant: Variant) -> None:
    """Create the variant's tables, unpartitioned, in ``catalog`` (a fresh one per system and round)."""
    catalog.create_namespace_if_not_exists(NAMESPACE)
    for n, name in enumerate(variant.table_names()):
        catalog.create_table(name, schema=variant.schema(n))
