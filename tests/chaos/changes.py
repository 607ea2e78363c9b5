"""The chaos run's change traffic: a Debezium change stream into a replicated table, and its model.

Change traffic is a *mode* of the run (``--change-events N``), not a kind: a kind is one way to
break the sink, while the change stream is load that every kind's breakage lands on (a driver kill
in the middle of a change slice, a coordinator killed after a change table's resolution, a broker
restart while deletes are queued). With it on, each kind is tried against appends and changes at once.

The stream is the change benchmark's (:mod:`bench.change_stream`, generated
column-wise in numpy and Arrow, seeded): a source table of ``keys`` rows exists before the stream
(the runner creates the sink's table holding them, as a replica starts from Debezium's snapshot),
then ``events`` changes, 70% updates, 20% inserts, 10% deletes, as Debezium's plain JSON. Here each
delete is followed by its tombstone (Debezium's default ``tombstones.on.delete=true``), which the sink
skips. Every message carries the Kafka key ``{"id": n}``, so the producer's partitioner puts all of a
key's changes in one partition of the change topic, as Debezium's does.

The model is the stream's: each live key's last row (``ChangeStream.final``), computed when the stream
is generated. It is what the table must hold once every message is in the topic in order, which the
verdict checks first (``verify``), so a model that does not apply is reported, never trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bench.change_stream import ChangePlan, create_table, generate

TABLE = "chaos.customers"
"""The change table: in the ``chaos`` namespace beside the append tables, listed and maintained with them."""
SOURCE_TABLE = "customers"
PARTITIONS = 2
KEYS_PER_EVENT = 0.25
"""The key space against the stream's length: most keys change several times, some are deleted and
inserted again, so a key's last change often lands in another commit round than its first."""
ROUTE: dict[str, Any] = {
    "when": f"source.table == '{SOURCE_TABLE}'",
    "changes": {"format": "debezium", "key": ["id"]},
}
"""The change table's entry in the sink's ``tables:`` (its identifier field ``id`` matches the key)."""


@dataclass(frozen=True)
class ChangeTraffic:
    """The change topic's messages in the order they are produced, and the table they must leave."""

    topic: str
    keys: list[bytes]
    values: list[bytes | None]
    """Debezium events, and ``None`` for the tombstone after each delete."""
    ops: dict[str, int]
    """Events per op (``c``, ``u``, ``d``)."""
    initial: pa.Table
    """The table's rows before the stream (the runner creates the table with them)."""
    model: pa.Table
    """Each live key's last row after the whole stream, sorted by id."""

    @property
    def tombstones(self) -> int:
        return self.ops.get("d", 0)

    def __len__(self) -> int:
        return len(self.values)


def change_traffic(topic: str, events: int, seed: int) -> ChangeTraffic:
    """``events`` changes over ``events * KEYS_PER_EVENT`` keys, with tombstones, for ``topic``."""
    stream = generate(ChangePlan(keys=max(int(events * KEYS_PER_EVENT), 1), events=events, seed=seed))
    deletes = pc.match_substring(stream.values, '"op":"d"').to_numpy(zero_copy_only=False)
    # Each delete's message twice in a row: the event, then its tombstone (the same key, no value).
    order = np.repeat(np.arange(len(deletes)), np.where(deletes, 2, 1))
    tombstone = np.zeros(len(order), dtype=bool)
    tombstone[1:] = order[1:] == order[:-1]
    values = stream.values.take(pa.array(order)).cast(pa.binary())
    values = pc.if_else(pa.array(tombstone), pa.scalar(None, pa.binary()), values)
    return ChangeTraffic(
        topic=topic,
        keys=stream.keys.take(pa.array(order)).cast(pa.binary()).to_pylist(),
        values=values.to_pylist(),
        ops=stream.ops,
        initial=stream.initial,
        model=stream.final,
    )


def create_change_table(catalog: Any, traffic: ChangeTraffic) -> None:
    """The replica's table with the source's rows before the stream (format v2, ``id`` its identifier
    field), created before the app starts: the sink finds it and checks its key against it."""
    create_table(catalog, traffic.initial, TABLE)
