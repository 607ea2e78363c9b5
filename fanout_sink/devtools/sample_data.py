"""Realistic shop events (orders, payments, clicks) for the demo, benchmarks and end-to-end tests.

Seeded, so a run can be repeated exactly; ids are unique per (seed, start) so tests can count them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

_COUNTRIES = ["DE", "FR", "NL", "PL", "SE", "ES", "IT", "US", "GB", "JP"]
_SKUS = [f"SKU-{n:05d}" for n in range(1, 400)]
_PAGES = ["/", "/search", "/cart", "/checkout", "/product", "/account", "/help"]
_METHODS = ["card", "paypal", "sepa", "klarna"]
_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class SampleEvent:
    topic: str
    key: bytes
    value: bytes


def _iso(ms: int) -> str:
    seconds, millis = divmod(ms, 1000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{millis:03d}Z"


def shop_events(count: int, seed: int = 7, start: int = 0) -> Iterator[SampleEvent]:
    """``count`` events across two topics: ``orders`` carries orders (~45%) and payments (~35%),
    told apart by their ``type`` field as routing rules must; ``clicks`` carries clicks (~20%).

    Every record has a unique ``id`` of the form ``<type>-<n>``. Timestamps come in two shapes on
    purpose (ISO-8601 strings and epoch milliseconds) and amounts as strings or numbers, as real
    producers send them.
    """
    rng = random.Random(seed * 1_000_003 + start)
    for n in range(start, start + count):
        ts = _BASE_MS + n * 250 + rng.randrange(0, 250)
        customer = rng.randrange(1, 5000)
        roll = rng.random()
        record: dict[str, object]
        if roll < 0.45:
            items = [
                {"sku": rng.choice(_SKUS), "qty": rng.randrange(1, 4), "price": round(rng.uniform(2, 250), 2)}
                for _ in range(rng.randrange(1, 4))
            ]
            record = {
                "type": "order",
                "id": f"order-{n}",
                "customer": {"id": customer, "country": rng.choice(_COUNTRIES)},
                "items": items,
                "amount": f"{sum(i['qty'] * i['price'] for i in items):.2f}",  # type: ignore[operator]
                "currency": "EUR",
                "ts": _iso(ts),
            }
            topic = "orders"
        elif roll < 0.8:
            record = {
                "type": "payment",
                "id": f"payment-{n}",
                "order_id": f"order-{max(0, n - rng.randrange(1, 20))}",
                "method": rng.choice(_METHODS),
                "amount": round(rng.uniform(2, 500), 2),
                "ts": ts,
            }
            topic = "orders"
        else:
            record = {
                "type": "click",
                "id": f"click-{n}",
                "session": f"s-{rng.randrange(1, 2000):04d}",
                "page": rng.choice(_PAGES),
                "customer_id": customer if rng.random() < 0.6 else None,
                "ts": _iso(ts),
            }
            topic = "clicks"
        yield SampleEvent(
            topic, str(record["id"]).encode(), json.dumps(record, separators=(",", ":")).encode()
        )
