"""What a table remembers about a sink: snapshot summary properties, namespaced by sink name.

Each append of the coordinator records, in its snapshot summary:

- ``fanout-sink.<sink>.control-offsets``: JSON ``{"<control partition>": <next control offset>}``,
  the control offset below which every event for this table has been appended (invariant I4);
- ``fanout-sink.<sink>.commit-id``: the uuid of the commit round;
- ``fanout-sink.<sink>.vtts``: valid-through timestamp, epoch milliseconds (absent when unknown).

The table itself is the only place these can live without a second commit that could be lost in a
crash: they are committed atomically with the files. Other writers (another sink, compaction, a
user) may commit after us, so the state is found by walking the snapshot ancestry back to the
latest snapshot that carries this sink's keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

PREFIX = "fanout-sink"


def key(sink: str, name: str) -> str:
    return f"{PREFIX}.{sink}.{name}"


@dataclass(frozen=True)
class TableState:
    """This sink's last commit to one table, as read from the snapshot ancestry."""

    snapshot_id: int | None = None
    commit_id: str | None = None
    control_offsets: dict[int, int] = field(default_factory=dict)
    vtts_ms: int | None = None
    timestamp_ms: int | None = None

    def next_control_offset(self, partition: int = 0) -> int:
        """Events for this table at control offsets below this are in the table already."""
        return self.control_offsets.get(partition, 0)


def summary_properties(
    sink: str, control_offsets: dict[int, int], commit_id: str, vtts_ms: int | None
) -> dict[str, str]:
    props = {
        key(sink, "control-offsets"): json.dumps({str(p): o for p, o in sorted(control_offsets.items())}),
        key(sink, "commit-id"): commit_id,
    }
    if vtts_ms is not None:
        props[key(sink, "vtts")] = str(vtts_ms)
    return props


def read_state(table: Table, sink: str) -> TableState:
    """The state of the latest snapshot in the current ancestry committed by ``sink`` (empty if none)."""
    offsets_key = key(sink, "control-offsets")
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is None or (raw := summary.get(offsets_key)) is None:
            continue
        vtts = summary.get(key(sink, "vtts"))
        return TableState(
            snapshot_id=snapshot.snapshot_id,
            commit_id=summary.get(key(sink, "commit-id")),
            control_offsets={int(p): int(o) for p, o in json.loads(raw).items()},
            vtts_ms=int(vtts) if vtts is not None else None,
            timestamp_ms=snapshot.timestamp_ms,
        )
    return TableState()
