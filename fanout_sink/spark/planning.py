"""What a run reads and from where: source partitions, the sink group, Spark's checkpoint.

Spark's checkpoint drives Spark; the sink-managed group is the truth about what was delivered
(invariant I1). Before the stream starts, the sink group's offsets decide where Spark starts (the
missing ones recovered by :mod:`fanout_sink.protocol.positions`), and a checkpoint found ahead of
a KNOWN delivered position is moved aside. Per micro-batch, the planned ranges come from
the checkpoint: offsets have holes (transaction markers, aborted and compacted records), so a
slice's end is the end Spark planned for the batch, never the last record's offset + 1. Spark writes
each batch's end offsets to ``offsets/<batchId>`` before running it, and the first batch's start
offsets to ``sources/0/0``; the start of batch N is the end of batch N-1.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from fanout_sink.config import SinkConfig
from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.client import client_conf
from fanout_sink.kafka.offsets import GroupOffsets
from fanout_sink.protocol.channel import sink_group
from fanout_sink.protocol.positions import recover_positions, restore_positions

log = logging.getLogger("fanout_sink.app")

TopicPartitionKey = tuple[str, int]
PlannedRanges = dict[TopicPartitionKey, tuple[int, int]]


class CheckpointError(FanoutSinkError):
    """The Spark checkpoint does not hold what the sink needs to plan a batch."""


def _local_path(location: str) -> Path:
    return Path(location[len("file://") :] if location.startswith("file://") else location)


def _offsets_json(path: Path) -> dict[str, dict[str, int]]:
    """The Kafka source's offsets: the last line of an offset log file (the first lines are versions)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise CheckpointError(
            f"cannot read Spark's offset log {path}: {exc}. The sink plans each batch from it; "
            "check the checkpoint location's permissions."
        ) from exc
    line = text.strip().splitlines()[-1]
    data: Any = json.loads(line)
    return {topic: {part: int(off) for part, off in parts.items()} for topic, parts in data.items()}


def _flatten(offsets: dict[str, dict[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(topic, int(part)): off for topic, parts in offsets.items() for part, off in parts.items()}


def batch_end_offsets(checkpoint: str, batch_id: int) -> dict[TopicPartitionKey, int]:
    return _flatten(_offsets_json(_local_path(checkpoint) / "offsets" / str(batch_id)))


def planned_ranges(checkpoint: str, batch_id: int) -> PlannedRanges:
    """``{(topic, partition): (start, end)}`` for batch ``batch_id``: start inclusive, end exclusive.

    A partition that appears for the first time in this batch (new partition) starts at 0: the
    worker then has no planned start to compare with beyond what the sink group says.
    """
    root = _local_path(checkpoint)
    ends = batch_end_offsets(checkpoint, batch_id)
    previous = root / "offsets" / str(batch_id - 1)
    initial = root / "sources" / "0" / "0"
    if batch_id > 0 and previous.exists():
        starts = _flatten(_offsets_json(previous))
    elif initial.exists():
        starts = _flatten(_offsets_json(initial))
    else:
        raise CheckpointError(
            f"Spark's checkpoint {root} has neither offsets/{batch_id - 1} nor sources/0/0, so batch "
            f"{batch_id} cannot be planned. Was the checkpoint folder edited? Move it aside to restart "
            "from the sink-managed group's offsets."
        )
    return {key: (min(starts.get(key, 0), end), end) for key, end in ends.items()}


def last_committed_ends(checkpoint: str) -> dict[TopicPartitionKey, int] | None:
    """End offsets of the newest batch Spark considers done (``commits/<id>``), or None when fresh."""
    root = _local_path(checkpoint)
    commits = root / "commits"
    ids = (
        sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()), reverse=True)
        if commits.is_dir()
        else []
    )
    for batch_id in ids:
        path = root / "offsets" / str(batch_id)
        if path.exists():
            return _flatten(_offsets_json(path))
    return None


def starting_offsets_option(
    topics: list[str], partitions: dict[str, int], committed: dict[TopicPartitionKey, int], fallback: str
) -> str:
    """Spark's ``startingOffsets`` JSON: the sink group's offset where known, else the fallback.

    Spark spells earliest as -2 and latest as -1 inside the JSON form.
    """
    default = -2 if fallback == "earliest" else -1
    spec = {
        topic: {str(part): committed.get((topic, part), default) for part in range(partitions[topic])}
        for topic in topics
    }
    return json.dumps(spec)


def source_partitions(config: SinkConfig) -> dict[str, int]:
    """The partition count of every source topic: ``source.topics``, plus what ``source.pattern``
    matches now (internal topics excluded)."""
    admin = AdminClient(client_conf(config.kafka))
    metadata = admin.list_topics(timeout=30)
    wanted = list(config.source.topics)
    if config.source.pattern:
        rx = re.compile(config.source.pattern)
        wanted += [t for t in metadata.topics if rx.fullmatch(t) and not t.startswith("__")]
    missing = [t for t in wanted if t not in metadata.topics]
    if missing:
        raise FanoutSinkError(
            f"source topics {missing} do not exist on {config.kafka.get('bootstrap.servers')}; "
            "create them or fix source.topics"
        )
    return {t: len(metadata.topics[t].partitions) for t in sorted(set(wanted))}


def sink_group_offsets(config: SinkConfig, partitions: dict[str, int]) -> dict[TopicPartitionKey, int]:
    """What the sink group says was delivered, read without waiting for open transactions.

    Only where Spark starts reading depends on it: an answer that is too low (a transaction still
    pending) is harmless, because each worker fences, reads stably and skips what is delivered.
    """
    reader = GroupOffsets(config.kafka, sink_group(config.name), stable=False)
    try:
        wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
        found = reader.committed(wanted)
    finally:
        reader.close()
    return {key: value for key, value in found.items() if value is not None}


def reconcile_checkpoint(checkpoint: str, delivered: dict[TopicPartitionKey, int]) -> None:
    """A checkpoint ahead of the sink group would skip undelivered records: move it aside.

    Only a partition whose delivered position is KNOWN and below the checkpoint's is "ahead". A
    partition the sink never delivered (nothing in the group, nothing recovered) keeps the
    checkpoint's position: reading "no offset" as "ahead" discarded the checkpoint on every restart,
    and under ``latest`` skipped what was produced while the app was down.
    """
    root = _local_path(checkpoint)
    if not root.exists():
        return
    ends = last_committed_ends(checkpoint)
    if ends is None:
        return
    ahead = {
        key: (end, delivered[key]) for key, end in ends.items() if key in delivered and end > delivered[key]
    }
    if not ahead:
        behind = {key for key, end in ends.items() if end < delivered.get(key, end)}
        if behind:
            log.info(
                "the Spark checkpoint is behind the sink group on %s: those records were delivered "
                "already and are skipped",
                sorted(behind),
            )
        return
    stale = root.with_name(f"{root.name}.stale-{int(time.time())}")
    shutil.move(str(root), stale)
    detail = ", ".join(f"{t}[{p}]: checkpoint {e}, group {c}" for (t, p), (e, c) in sorted(ahead.items()))
    log.warning(
        "the Spark checkpoint is ahead of the sink-managed group (%s). The group is the truth about "
        "what was delivered, so the checkpoint was moved to %s and the stream restarts from the "
        "group's offsets.",
        detail,
        stale,
    )


def _checkpoint_ends(checkpoint: str) -> dict[TopicPartitionKey, int]:
    return (last_committed_ends(checkpoint) or {}) if _local_path(checkpoint).exists() else {}


def _checkpoint_starts(checkpoint: str) -> dict[TopicPartitionKey, int]:
    """Where the checkpoint's first batch started (``sources/0/0``); a partition missing there
    appeared later and started at 0 (as in :func:`planned_ranges`)."""
    initial = _local_path(checkpoint) / "sources" / "0" / "0"
    return _flatten(_offsets_json(initial)) if initial.exists() else {}


def plan_start(config: SinkConfig, partitions: dict[str, int]) -> str:
    """Where the stream starts; returns Spark's ``startingOffsets`` (used when no checkpoint is kept).

    The sink group's offsets, with the missing ones recovered (``protocol.positions``). A partition
    whose position stays unknown (the control topic's history was cut) takes Spark's checkpoint's
    position when the checkpoint has it (a batch in ``commits/`` was delivered in full), else the
    configured start, with a WARNING naming it. Then the checkpoint is reconciled with the known
    positions. A partition the sink never delivered keeps the checkpoint's position when no batch
    moved it (its first batch's start), also when the checkpoint is moved aside for another one.
    """
    wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
    committed = sink_group_offsets(config, partitions)
    recovery = recover_positions(config.kafka, config.name, config.control_topic, wanted, committed)
    checkpoint = config.checkpoint_location
    ends = _checkpoint_ends(checkpoint)
    trusted = {key: ends[key] for key in recovery.unknown if key in ends}
    for topic, part in sorted(trusted):
        log.warning(
            "%s[%d]: the sink group has no offset and the control topic %r no longer holds its history "
            "(log start > 0); trusting Spark's checkpoint, which delivered up to %d",
            topic,
            part,
            config.control_topic,
            trusted[(topic, part)],
        )
    for topic, part in sorted(recovery.unknown - trusted.keys()):
        log.warning(
            "%s[%d]: the delivered position is unknown (no sink-group offset, the control topic %r no "
            "longer holds its history, not in Spark's checkpoint); starting from source.starting-offsets "
            "%r, which may duplicate or skip records",
            topic,
            part,
            config.control_topic,
            config.source.starting_offsets,
        )
    known = {
        **recovery.delivered,
        **restore_positions(config.kafka, config.name, trusted, "Spark's checkpoint"),
    }
    shown = {f"{t}[{p}]": o for (t, p), o in sorted(known.items())}
    log.info("source partitions %s; the sink has delivered up to %s", partitions, shown)
    # A partition the sink never delivered was never advanced by a batch that carried a record (each
    # planned range that moves a partition commits a DataComplete, empty or not), so the checkpoint
    # may only hold it where its first batch started. Beyond that it claims deliveries the sink
    # never made (a copied checkpoint): ahead.
    starts = _checkpoint_starts(checkpoint)
    never = {key: starts.get(key, 0) for key in recovery.never_delivered if key in ends}
    reconcile_checkpoint(checkpoint, {**never, **known})
    return starting_offsets_option(
        list(partitions), partitions, {**never, **known}, config.source.starting_offsets
    )
