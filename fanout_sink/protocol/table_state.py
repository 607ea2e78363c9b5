"""What a table remembers about a sink: snapshot summary properties, namespaced by sink name.

Each append of the coordinator records, in its snapshot summary:

- ``fanout-sink.<sink>.control-offsets``: JSON ``{"<control partition>": <next control offset>}``,
  the control offset below which every event for this table has been appended (invariant I4);
- ``fanout-sink.<sink>.commit-id``: the uuid of the commit round;
- ``fanout-sink.<sink>.vtts``: valid-through timestamp, epoch milliseconds (absent when unknown);
- ``fanout-sink.<sink>.round-tables``: how many tables the round commits, when its end cuts no
  worker transaction (absent otherwise): a reader that finds that many snapshots of the commit id
  knows every table holds the stream up to the round's end and nothing past it
  (:mod:`fanout_sink.consistent_read`; snapshot summary only, like the next keys);
- on a change table, ``fanout-sink.<sink>.inserted-rows``, ``updated-rows`` and ``deleted-rows``: what
  the commit did per key, beside Iceberg's own ``added-records`` and ``added-position-deletes``
  (snapshot summary only: they describe one commit, not the table's state).

The table itself is the only place these can live without a second commit that could be lost in a
crash: they are committed atomically with the files. Other writers (another sink, compaction, a
user) may commit after us, so the state is found by walking the snapshot ancestry back to the
latest snapshot that carries this sink's keys.

Snapshot summaries alone do not last: once others have committed on top, a routine
``expire_snapshots`` removes the sink's snapshots and the ancestry no longer says how far the
table is committed; a coordinator re-reading the control topic would then append the same files
again. So the same keys are also set as table properties, in the same Iceberg transaction as the
append (one metadata commit: both or neither), and the state read is the further of the two.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID, SetPropertiesUpdate

from fanout_sink.retries import Retry

PREFIX = "fanout-sink"
MAINTENANCE_LAST_RUN_MS = f"{PREFIX}.maintenance.last-run-ms"
"""Table property: when ``fanout-sink maintain`` last finished on the table (epoch ms). Not namespaced
by sink: maintenance acts on the table, whichever sink runs it."""


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
    round_tables: int | None = None
    """How many tables the commit's round committed, when it was a consistent point (summaries only)."""

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


def change_properties(sink: str, inserted: int, updated: int, deleted: int) -> dict[str, str]:
    """A change commit's row counts, for its snapshot summary."""
    return {
        key(sink, "inserted-rows"): str(inserted),
        key(sink, "updated-rows"): str(updated),
        key(sink, "deleted-rows"): str(deleted),
    }


def round_properties(sink: str, tables: int) -> dict[str, str]:
    """A consistent round's table count, for the snapshot summary of each table it commits."""
    return {key(sink, "round-tables"): str(tables)}


def stale_properties(table: Table, sink: str, vtts_ms: int | None) -> tuple[str, ...]:
    """Table properties of ``sink`` that a commit with ``vtts_ms`` must remove (an unknown VTTS)."""
    vtts_key = key(sink, "vtts")
    return (vtts_key,) if vtts_ms is None and vtts_key in table.metadata.properties else ()


def _state_from(
    values: Mapping[str, str], sink: str, snapshot_id: int | None = None, timestamp_ms: int | None = None
) -> TableState | None:
    raw = values.get(key(sink, "control-offsets"))
    if raw is None:
        return None
    vtts = values.get(key(sink, "vtts"))
    tables = values.get(key(sink, "round-tables"))
    return TableState(
        commit_id=values.get(key(sink, "commit-id")),
        control_offsets={int(p): int(o) for p, o in json.loads(raw).items()},
        vtts_ms=int(vtts) if vtts is not None else None,
        snapshot_id=snapshot_id,
        timestamp_ms=timestamp_ms,
        round_tables=int(tables) if tables is not None else None,
    )


def snapshot_state(snapshot: Snapshot, sink: str) -> TableState | None:
    """This sink's state as one snapshot's summary records it; None when the snapshot is not a
    commit of this sink (another writer's, maintenance's)."""
    if snapshot.summary is None:
        return None
    return _state_from(snapshot.summary, sink, snapshot.snapshot_id, snapshot.timestamp_ms)


def _ancestry_state(table: Table, sink: str) -> TableState | None:
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        found = snapshot_state(snapshot, sink)
        if found is not None:
            return found
    return None


def _further(a: TableState, b: TableState) -> bool:
    """Whether ``a`` is further than ``b`` (by the highest control offset)."""
    return max(a.control_offsets.values(), default=0) > max(b.control_offsets.values(), default=0)


def read_state(table: Table, sink: str) -> TableState:
    """This sink's state: the latest of its snapshot in the current ancestry and the table properties.

    The ancestry is preferred (it names the snapshot); the properties win when they are further,
    which is the case once the sink's snapshots were expired.
    """
    in_ancestry = _ancestry_state(table, sink)
    in_properties = _state_from(table.metadata.properties, sink)
    if in_properties is None or (in_ancestry is not None and not _further(in_properties, in_ancestry)):
        return in_ancestry or TableState()
    return in_properties


def properties_behind(table: Table, sink: str) -> dict[str, str]:
    """The properties to set so that the table properties carry this sink's state as far as the
    snapshot ancestry does; empty when they do already.

    Tables committed before the sink set the properties hold the floor only in snapshot summaries,
    which snapshot expiry removes: maintenance writes these before it expires anything.
    """
    in_ancestry = _ancestry_state(table, sink)
    in_properties = _state_from(table.metadata.properties, sink)
    if in_ancestry is None or in_ancestry.commit_id is None:
        return {}
    if in_properties is not None and not _further(in_ancestry, in_properties):
        return {}
    return summary_properties(sink, in_ancestry.control_offsets, in_ancestry.commit_id, in_ancestry.vtts_ms)


PERSIST_RETRY = Retry(attempts=5, retry_on=(CommitFailedException,))
""":func:`persist_state` conflicting with a commit meanwhile reloads and decides again at once, 5
times in all."""


def persist_state(catalog: Catalog, identifier: str, sink: str) -> dict[str, str]:
    """Set :func:`properties_behind` as table properties (nothing when none are behind); the
    properties written.

    The commit requires the current snapshot it read the ancestry at, so it can never set an older
    floor over a newer one the sink committed meanwhile: a conflict reloads and decides again.
    """

    def attempt() -> dict[str, str]:
        table = catalog.load_table(identifier)
        behind = properties_behind(table, sink)
        if not behind:
            return {}
        snapshot = table.current_snapshot()
        requirements = (
            AssertTableUUID(uuid=table.metadata.table_uuid),
            AssertRefSnapshotId.model_validate(
                {"ref": MAIN_BRANCH, "snapshot-id": snapshot.snapshot_id if snapshot else None}
            ),
        )
        catalog.commit_table(table, requirements, (SetPropertiesUpdate(updates=behind),))
        return behind

    return PERSIST_RETRY.run(attempt)


def set_property(catalog: Catalog, identifier: str, name: str, value: str) -> None:
    """Set one table property; a commit of the sink meanwhile reloads and sets it again
    (:data:`PERSIST_RETRY`), never rolling the sink's own properties back."""

    def attempt() -> None:
        table = catalog.load_table(identifier)
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid),)
        catalog.commit_table(table, requirements, (SetPropertiesUpdate(updates={name: value}),))

    PERSIST_RETRY.run(attempt)


@dataclass(frozen=True)
class SinkTable:
    """A table holding at least one commit of a sink, with that sink's state as read on listing."""

    identifier: str
    table: Table
    state: TableState


def sink_tables(catalog: Catalog, sink: str) -> list[SinkTable]:
    """Every table of ``catalog`` that holds a commit of ``sink`` (in its ancestry or its properties),
    sorted by identifier: what ``status`` shows and what ``maintain`` keeps healthy."""
    found = []
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            table = catalog.load_table(identifier)
            state = read_state(table, sink)
            if state.commit_id is not None:
                found.append(SinkTable(".".join(identifier), table, state))
    return sorted(found, key=lambda t: t.identifier)
