"""What a run reads and from where: source partitions, the sink group, Spark's checkpoint.

Spark's checkpoint drives Spark; the sink-managed group is the truth about what was delivered
(invariant I1). Before the stream starts, the sink group's offsets decide where Spark starts (the
missing ones recovered by :mod:`fanout_sink.protocol.recovery`), and a checkpoint found ahead of
a KNOWN delivered position is moved aside. Per micro-batch, the planned ranges come from
the checkpoint: offsets have holes (transaction markers, aborted and compacted records), so a
slice's end is the end Spark planned for the batch, never the last record's offset + 1. Spark writes
each batch's end offsets to ``offsets/<batchId>`` before running it, and the first batch's start
offsets to ``sources/0/0``; the start of batch N is the end of batch N-1.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fanout_sink.config.models import SinkConfig
from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.topics import pattern_topics
from fanout_sink.protocol import recovery
from fanout_sink.protocol.channel import SinkChannel

log = logging.getLogger("fanout_sink.app")

TopicPartitionKey = tuple[str, int]
PlannedRanges = dict[TopicPartitionKey, tuple[int, int]]
_T = TypeVar("_T")


class CheckpointError(FanoutSinkError):
    """The Spark checkpoint does not hold what the sink needs to plan a batch."""


def is_local_checkpoint(location: str) -> bool:
    """A checkpoint on this machine's filesystem (a path or ``file://``), read with Python's I/O."""
    return location.startswith("file:") or "://" not in location


class CheckpointFiles(Protocol):
    """The few file operations planning needs on a checkpoint, relative to its root folder."""

    location: str

    def exists(self) -> bool: ...
    def read(self, *parts: str) -> str | None:
        """A file's text, or None when it does not exist."""

    def names(self, *parts: str) -> list[str]:
        """The entries of a folder, or [] when it does not exist."""

    def move_aside(self, name: str) -> str:
        """Rename the checkpoint folder to ``name`` beside it; returns the new location."""


class LocalCheckpoint:
    """A checkpoint on local disk: the fast path, no JVM involved."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.root = Path(location[len("file://") :] if location.startswith("file://") else location)

    def exists(self) -> bool:
        return self.root.exists()

    def read(self, *parts: str) -> str | None:
        path = self.root.joinpath(*parts)
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(
                f"cannot read Spark's checkpoint file {path}: {exc}. The sink plans each batch from it.\n"
                "  fix: check the checkpoint location's permissions"
            ) from exc

    def names(self, *parts: str) -> list[str]:
        folder = self.root.joinpath(*parts)
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []

    def move_aside(self, name: str) -> str:
        target = self.root.with_name(name)
        shutil.move(str(self.root), target)
        return str(target)


class HadoopCheckpoint:
    """A checkpoint on ``s3a://``, ``hdfs://`` or any scheme Hadoop serves, read through Hadoop's
    FileSystem in the driver JVM: the same classes and configuration Spark writes it with."""

    def __init__(self, location: str, spark: Any) -> None:
        self.location = location
        self._jvm = spark._jvm
        self._root = self._jvm.org.apache.hadoop.fs.Path(location)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, *parts: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, "/".join(parts)) if parts else self._root

    def _call(self, what: str, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except Exception as exc:  # py4j's Py4JJavaError carries Hadoop's IOException
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(
                f"cannot {what} in Spark's checkpoint {self.location}: {first}. The sink plans each batch "
                "from it.\n  fix: check the store's endpoint, credentials (spark.hadoop.fs.*, derived "
                "from the catalog's s3.* properties) and permissions"
            ) from exc

    def exists(self) -> bool:
        return bool(self._call("look", lambda: self._fs.exists(self._root)))

    def read(self, *parts: str) -> str | None:
        path = self._path(*parts)

        def read() -> str | None:
            if not self._fs.exists(path):
                return None
            stream = self._fs.open(path)
            try:
                data: bytes = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
            return data.decode(errors="replace")

        return self._call(f"read {'/'.join(parts)}", read)

    def names(self, *parts: str) -> list[str]:
        path = self._path(*parts)

        def names() -> list[str]:
            if not self._fs.exists(path):
                return []
            return [str(status.getPath().getName()) for status in self._fs.listStatus(path)]

        return self._call(f"list {'/'.join(parts)}", names)

    def move_aside(self, name: str) -> str:
        target = self._jvm.org.apache.hadoop.fs.Path(self._root.getParent(), name)
        # On an object store this copies and deletes file by file: slower, but the checkpoint is small.
        if not self._call("rename the checkpoint", lambda: self._fs.rename(self._root, target)):
            raise CheckpointError(
                f"Hadoop could not rename Spark's checkpoint {self.location} to {target.toString()}.\n"
                "  fix: move the checkpoint aside by hand (or delete it) and restart; the sink group's "
                "offsets say where to resume"
            )
        # An object store has no folders: a rename is copies and deletes, and a store may keep an
        # empty folder entry behind (S3Proxy's filesystem backend does under load). Only files matter
        # to Spark, so any file still here means something else writes this checkpoint.
        left = self.file_paths()
        if left:
            raise CheckpointError(
                f"Spark's checkpoint {self.location} still holds {len(left)} file(s) after it was moved "
                f"to {target.toString()}: {', '.join(left[:5])}. Another query may be writing it.\n"
                "  fix: stop every query that uses this checkpoint location, move what is left aside "
                "by hand and restart; the sink group's offsets say where to resume"
            )
        return str(target.toString())

    def file_paths(self) -> list[str]:
        """Every file below the checkpoint's root (an empty folder entry holds none)."""

        def listed() -> list[str]:
            if not self._fs.exists(self._root):
                return []
            found = self._fs.listFiles(self._root, True)
            paths: list[str] = []
            while found.hasNext():
                paths.append(str(found.next().getPath().toString()))
            return paths

        return self._call("list", listed)


def open_checkpoint(location: str, spark: Any = None) -> CheckpointFiles:
    """The checkpoint's files: local disk directly, any other scheme through the session's JVM."""
    if is_local_checkpoint(location):
        return LocalCheckpoint(location)
    if spark is None:
        raise CheckpointError(
            f"the checkpoint {location} is not on local disk and no Spark session was given to read it "
            "through Hadoop's FileSystem.\n  fix: pass the session (planning.plan_start(..., spark))"
        )
    return HadoopCheckpoint(location, spark)


def _offsets(files: CheckpointFiles, *parts: str) -> dict[TopicPartitionKey, int] | None:
    """The Kafka source's offsets in an offset log file (its last line; the first lines are
    versions), flattened; None when the file does not exist."""
    text = files.read(*parts)
    if text is None:
        return None
    line = text.strip().splitlines()[-1]
    data: Any = json.loads(line)
    return {(topic, int(part)): int(off) for topic, parts_ in data.items() for part, off in parts_.items()}


def batch_end_offsets(checkpoint: str, batch_id: int, spark: Any = None) -> dict[TopicPartitionKey, int]:
    files = open_checkpoint(checkpoint, spark)
    ends = _offsets(files, "offsets", str(batch_id))
    if ends is None:
        raise CheckpointError(
            f"Spark's offset log {checkpoint}/offsets/{batch_id} does not exist. The sink plans each batch "
            "from it; was the checkpoint folder edited?\n  fix: move the checkpoint aside to restart from "
            "the sink-managed group's offsets"
        )
    return ends


def planned_ranges(checkpoint: str, batch_id: int, spark: Any = None) -> PlannedRanges:
    """``{(topic, partition): (start, end)}`` for batch ``batch_id``: start inclusive, end exclusive.

    A partition that appears for the first time in this batch (new partition) starts at 0: the
    worker then has no planned start to compare with beyond what the sink group says. ``spark`` is
    needed for a checkpoint that is not on local disk.
    """
    files = open_checkpoint(checkpoint, spark)
    ends = batch_end_offsets(checkpoint, batch_id, spark)
    starts = _offsets(files, "offsets", str(batch_id - 1)) if batch_id > 0 else None
    if starts is None:
        starts = _offsets(files, "sources", "0", "0")
    if starts is None:
        raise CheckpointError(
            f"Spark's checkpoint {checkpoint} has neither offsets/{batch_id - 1} nor sources/0/0, so batch "
            f"{batch_id} cannot be planned. Was the checkpoint folder edited? Move it aside to restart "
            "from the sink-managed group's offsets."
        )
    return {key: (min(starts.get(key, 0), end), end) for key, end in ends.items()}


def last_committed_ends(checkpoint: str, spark: Any = None) -> dict[TopicPartitionKey, int] | None:
    """End offsets of the newest batch Spark considers done (``commits/<id>``), or None when fresh."""
    files = open_checkpoint(checkpoint, spark)
    ids = sorted((int(name) for name in files.names("commits") if name.isdigit()), reverse=True)
    for batch_id in ids:
        ends = _offsets(files, "offsets", str(batch_id))
        if ends is not None:
            return ends
    return None


def starting_offsets_option(
    topics: list[str],
    partitions: dict[str, int],
    committed: dict[TopicPartitionKey, int],
    fallback: str,
    earliest: frozenset[TopicPartitionKey] = frozenset(),
) -> str:
    """Spark's ``startingOffsets`` JSON: the sink group's offset where known, earliest for the
    partitions in ``earliest`` (a recreated topic's), else the fallback.

    Spark spells earliest as -2 and latest as -1 inside the JSON form.
    """
    default = -2 if fallback == "earliest" else -1
    spec = {
        topic: {
            str(part): -2 if (topic, part) in earliest else committed.get((topic, part), default)
            for part in range(partitions[topic])
        }
        for topic in topics
    }
    return json.dumps(spec)


def source_partitions(config: SinkConfig, channel: SinkChannel) -> dict[str, int]:
    """The partition count of every source topic: ``source.topics``, plus what ``source.pattern``
    matches now (internal topics excluded), asked through ``channel``'s clients."""
    clients = channel.clients
    metadata = clients.admin().list_topics(timeout=clients.timeout_s)
    wanted = list(config.source.topics)
    if config.source.pattern:
        wanted += pattern_topics(config.source.pattern, metadata.topics)
    missing = [t for t in wanted if t not in metadata.topics]
    if missing:
        raise FanoutSinkError(
            f"source topics {missing} do not exist on {config.kafka.get('bootstrap.servers')}; "
            "create them or fix source.topics"
        )
    return {t: len(metadata.topics[t].partitions) for t in sorted(set(wanted))}


def reconcile_checkpoint(checkpoint: str, delivered: dict[TopicPartitionKey, int], spark: Any = None) -> None:
    """A checkpoint ahead of the sink group would skip undelivered records: move it aside.

    Only a partition whose delivered position is KNOWN and below the checkpoint's is "ahead". A
    partition the sink never delivered (nothing in the group, nothing recovered) keeps the
    checkpoint's position: reading "no offset" as "ahead" discarded the checkpoint on every restart,
    and under ``latest`` skipped what was produced while the app was down.
    """
    files = open_checkpoint(checkpoint, spark)
    if not files.exists():
        return
    ends = last_committed_ends(checkpoint, spark)
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
    stale = files.move_aside(f"{checkpoint.rstrip('/').rsplit('/', 1)[-1]}.stale-{int(time.time())}")
    detail = ", ".join(f"{t}[{p}]: checkpoint {e}, group {c}" for (t, p), (e, c) in sorted(ahead.items()))
    log.warning(
        "the Spark checkpoint is ahead of the sink-managed group (%s). The group is the truth about "
        "what was delivered, so the checkpoint was moved to %s and the stream restarts from the "
        "group's offsets.",
        detail,
        stale,
    )


def _checkpoint_starts(checkpoint: str, spark: Any) -> dict[TopicPartitionKey, int]:
    """Where the checkpoint's first batch started (``sources/0/0``); a partition missing there
    appeared later and started at 0 (as in :func:`planned_ranges`)."""
    return _offsets(open_checkpoint(checkpoint, spark), "sources", "0", "0") or {}


def plan_start(
    config: SinkConfig, channel: SinkChannel, partitions: dict[str, int], spark: Any = None
) -> str:
    """Where the stream starts; returns Spark's ``startingOffsets`` (used when no checkpoint is kept).

    The delivered positions come from ``protocol.recovery``: the sink group's offsets, the missing
    ones recovered, and for a partition whose position stays unknown (the control topic's history
    was cut) Spark's checkpoint's position when the checkpoint has it, else the configured start,
    with a WARNING naming it. Then the checkpoint is reconciled with the known positions. A
    partition the sink never delivered keeps the checkpoint's position when no batch moved it (its
    first batch's start), also when the checkpoint is moved aside for another one. A recreated
    topic (``source.recreated-topic-offsets: earliest``) counts as delivered up to 0, so a
    checkpoint holding the old topic's positions is ahead and moved aside, and Spark starts it at
    earliest. ``channel``: the run's, whose layout's transactional ids restore positions. ``spark``
    is needed for a checkpoint that is not on local disk (:func:`open_checkpoint`).
    """
    wanted = [(topic, part) for topic, count in partitions.items() for part in range(count)]
    found = recovery.recover_positions(channel, wanted, config.source.recreated_topic_offsets)
    checkpoint = config.checkpoint_location
    ends = last_committed_ends(checkpoint, spark) or {}
    known = recovery.known_positions(channel, found, ends, config.source.starting_offsets)
    shown = {f"{t}[{p}]": o for (t, p), o in sorted(known.items())}
    log.info("source partitions %s; the sink has delivered up to %s", partitions, shown)
    # A partition the sink never delivered was never advanced by a batch that carried a record (each
    # planned range that moves a partition commits a DataComplete, empty or not), so the checkpoint
    # may only hold it where its first batch started. Beyond that it claims deliveries the sink
    # never made (a copied checkpoint): ahead.
    starts = _checkpoint_starts(checkpoint, spark)
    never = {key: starts.get(key, 0) for key in found.never_delivered if key in ends}
    recreated = dict.fromkeys(found.recreated, 0)
    reconcile_checkpoint(checkpoint, {**never, **known, **recreated}, spark)
    return starting_offsets_option(
        list(partitions), partitions, {**never, **known}, config.source.starting_offsets, found.recreated
    )
