"""What other parties do to a running sink over a month: retention, table maintenance, table swaps,
a source topic deleted and recreated.

Each function does the real thing through the real interface (the broker's AdminClient, PyIceberg on
the real catalog), so the sink meets exactly what an operator's cron job or a colleague would leave
behind. Only the time is compressed: the runner calls these at a moment of its choosing instead of
after days.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform, Transform

from fanout_sink.config.loading import load_config
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import GroupOffsets, source_positions
from fanout_sink.protocol import group_layout, orphans

log = logging.getLogger("chaos")

OTHER_WRITER = "chaos.other-writer"
"""Snapshot-summary key of the commits the runner makes as another writer (never the sink's keys)."""
ASIDE_INFIX = "_old_"
"""A swapped table is renamed to ``<name>_old_<n>``; the verdict counts rows across both."""
_POLL_S = 1.0
# Partition fields a table's spec can gain, in order: columns every chaos table has or may have.
_SPEC_FIELDS: tuple[tuple[str, Transform[Any, Any]], ...] = (
    ("region", IdentityTransform()),
    ("id", BucketTransform(4)),
    ("type", IdentityTransform()),
    ("seq", BucketTransform(8)),
)


def group_expired(bootstrap: str, group: str, topics: list[str], timeout_s: float) -> bool:
    """Wait until ``group`` holds no committed offset for any partition of ``topics`` (the broker's
    offset retention removed them all); False if some are still there after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        positions = source_positions(KafkaClientFactory({"bootstrap.servers": bootstrap}), group, topics)
        left = [p for p in positions if p.committed is not None]
        if not left:
            return True
        if time.monotonic() > deadline:
            log.warning("group %s still has %d committed offsets after %.0fs", group, len(left), timeout_s)
            return False
        time.sleep(_POLL_S)


def group_caught_up(bootstrap: str, group: str, topics: list[str], timeout_s: float) -> bool:
    """Wait until ``group`` has delivered every partition of ``topics`` to its end (what an operator
    waits for before deleting a topic); False if it has not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        positions = source_positions(KafkaClientFactory({"bootstrap.servers": bootstrap}), group, topics)
        if positions and all(p.caught_up for p in positions):
            return True
        if time.monotonic() > deadline:
            log.warning("group %s has not delivered %s to their ends after %.0fs", group, topics, timeout_s)
            return False
        time.sleep(_POLL_S)


def recreate_topic(bootstrap: str, topic: str, config: dict[str, str], timeout_s: float = 120.0) -> None:
    """Delete ``topic`` and create it again under the same name with as many partitions (a new
    topic id, offsets from 0): the broker deletes asynchronously, so the create is retried while the
    name is still taken."""
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    partitions = len(admin.list_topics(topic=topic, timeout=30).topics[topic].partitions)
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(timeout=60)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(_POLL_S)


def delete_control_records(bootstrap: str, group: str, topic: str, timeout_s: float = 120.0) -> int | None:
    """Delete the control topic's records below ``group``'s committed low watermark, as retention
    does on a healthy sink; the new log start offset, or None when nothing was committed in time."""
    reader = GroupOffsets(KafkaClientFactory({"bootstrap.servers": bootstrap}), group, stable=False)
    deadline = time.monotonic() + timeout_s
    try:
        while (watermark := reader.committed([(topic, 0)]).get((topic, 0))) is None or watermark <= 0:
            if time.monotonic() > deadline:
                return None
            time.sleep(_POLL_S)
    finally:
        reader.close()
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    futures = admin.delete_records([TopicPartition(topic, 0, watermark)], operation_timeout=30)
    deleted = next(iter(futures.values())).result(timeout=60)
    return int(deleted.low_watermark)


def last_committed_table(catalog: Catalog, namespaces: tuple[str, ...]) -> str | None:
    """The table whose current snapshot is the newest: the one a coordinator just committed."""
    newest: tuple[int, str] | None = None
    for namespace in namespaces:
        for identifier in catalog.list_tables(namespace):
            name = ".".join(identifier)
            snapshot = catalog.load_table(name).current_snapshot()
            if snapshot is not None and (newest is None or snapshot.timestamp_ms > newest[0]):
                newest = (snapshot.timestamp_ms, name)
    return newest[1] if newest else None


def commit_as_other_writer_and_expire(catalog: Catalog, name: str) -> int:
    """Another writer appends zero rows on top of the sink's snapshots (a snapshot without the sink's
    summary keys), then a maintenance job expires every snapshot but the current one; the number of
    snapshots expired. The rows the verdict counts do not change."""
    table = catalog.load_table(name)
    table.append(table.schema().as_arrow().empty_table(), snapshot_properties={OTHER_WRITER: "empty-append"})
    table = catalog.load_table(name)
    current = table.current_snapshot()
    assert current is not None
    expired = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    return len(expired)


def evolve_partition_spec(catalog: Catalog, name: str, attempts: int = 5) -> str | None:
    """Add the next partition field the table does not have yet while the sink writes to it; the new
    field's name, or None when the table has none left to add. A conflict with the sink's own
    commit is retried on fresh metadata, as any writer would."""
    for _ in range(attempts):
        table = catalog.load_table(name)
        candidate = _next_spec_field(table)
        if candidate is None:
            return None
        column, transform = candidate
        field_name = f"{column}_{str(transform).split('[')[0]}"
        try:
            with table.update_spec() as update:
                update.add_field(column, transform, field_name)
        except CommitFailedException:
            continue
        return field_name
    return None


def _next_spec_field(table: Table) -> tuple[str, Transform[Any, Any]] | None:
    columns = {field.name: field.field_id for field in table.schema().fields}
    used = {field.source_id for field in table.spec().fields}
    for column, transform in _SPEC_FIELDS:
        if column in columns and columns[column] not in used:
            return column, transform
    return None


def swap_table(catalog: Catalog, name: str, serial: int) -> str:
    """A user's table swap: rename ``name`` aside to ``<name>_old_<serial>`` and create a new empty
    table with the same schema under ``name``; the aside name. If the sink auto-created the new
    table in between, that one stays (it is what the sink would have done anyway)."""
    aside = f"{name}{ASIDE_INFIX}{serial}"
    schema = catalog.load_table(name).schema()
    catalog.rename_table(name, aside)
    try:
        catalog.create_table(name, schema=schema)
    except TableAlreadyExistsError:
        log.info("%s was recreated by the sink before the swap could create it", name)
    return aside


def remove_orphans(catalog: Catalog, config_file: Path, tables: list[str]) -> tuple[int, timedelta]:
    """Orphan cleanup of ``tables`` with the sink's rules and its ``maintenance.orphan-older-than``
    (what ``fanout-sink maintain``'s orphan step runs, without Spark): files removed, and the age."""
    config = load_config(config_file)
    age = config.maintenance.orphan_older_than
    results = orphans.clean_tables(
        catalog,
        dict.fromkeys(tables, age),
        lambda: orphans.pending_files(group_layout.channel_in_use(config)),
    )
    for name, result in results.items():
        if result.error or result.failed:
            log.warning(
                "orphan cleanup of %s: %s (%d deletions failed)", name, result.error, len(result.failed)
            )
    return sum(len(result.removed) for result in results.values()), age
