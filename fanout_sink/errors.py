"""Exception types. Every error the sink raises on purpose says what went wrong and what to do next."""

from __future__ import annotations

import re


class FanoutSinkError(Exception):
    """Base of every error raised by fanout_sink on purpose."""


class StackError(FanoutSinkError):
    """The local stack (jars, JVM, broker) could not be brought up.

    ``cause`` is one line naming what failed; ``fix`` says what the operator should do about it.
    """

    def __init__(self, cause: str, fix: str, details: str = "") -> None:
        self.cause = cause
        self.fix = fix
        self.details = details
        message = f"{cause}\n  fix: {fix}"
        if details:
            message += f"\n{details}"
        super().__init__(message)


class EventVersionError(FanoutSinkError):
    """A control-topic event was written by a newer (or foreign) encoder than this one understands.

    Reading it with today's schema could misread fields silently, so decoding stops instead.
    """


class TopicError(FanoutSinkError):
    """One of the sink's own topics (control, dead letters) cannot be created or has an unusable shape."""


class ControlTopicError(TopicError):
    """Control events the sink has not acknowledged were deleted (retention, delete-records).

    Their data files may never have been appended while their source offsets are committed, so the
    coordinator refuses to skip them silently and stops.
    """

    def __init__(self, topic: str, group: str, needed_from: int | None, log_start: int) -> None:
        self.topic, self.group, self.needed_from, self.log_start = topic, group, needed_from, log_start
        where = (
            f"the coordinator needs events from offset {needed_from} on"
            if needed_from is not None
            else f"coordinator group {group!r} has acknowledged nothing, so it needs every event"
        )
        first = needed_from if needed_from is not None else 0
        super().__init__(
            f"control topic {topic!r} [0] lost events the sink still needs: {where}, but the log now "
            f"starts at offset {log_start}; offsets {first}..{log_start - 1} were deleted, by the "
            "topic's retention (retention.ms / retention.bytes) or by delete-records. Their data "
            "files may be missing from the tables while their source offsets are committed.\n"
            "  fix: restore the deleted events and restart; or, to accept the loss deliberately, run "
            f"`kafka-consumer-groups --bootstrap-server <brokers> --group {group} --topic {topic}:0 "
            f"--reset-offsets --to-offset {log_start} --execute`, then check the tables against the "
            "source for rows of the lost events, and give the control topic retention.ms=-1"
        )


class OffsetGapError(FanoutSinkError):
    """The sink-managed group is behind a slice: the records in between were never delivered.

    Committing the slice would lose them for good, so the worker refuses.
    """

    def __init__(self, topic: str, partition: int, committed: int, start: int, end: int, group: str) -> None:
        self.topic, self.partition, self.committed = topic, partition, committed
        self.start, self.end, self.group = start, end, group
        super().__init__(
            f"gap in {topic}[{partition}]: group {group!r} has delivered up to offset {committed} but the "
            f"slice to commit is [{start}, {end}); offsets {committed}..{start - 1} were never delivered.\n"
            f"  fix: restart the stream from offset {committed} (for Spark: delete the checkpoint or set "
            f"startingOffsets to the sink group's offsets); do not move the group's offset by hand."
        )


class TransactionStuckError(FanoutSinkError, TimeoutError):
    """A transactional call outlived its deadline: the producer is given up and replaced.

    A new producer with the same transactional id fences the stuck one, and the broker aborts its
    open transaction, so nothing it sent becomes visible.
    """


class ProducerFencedError(FanoutSinkError):
    """A newer process took over this transactional id; this one must stop (it is a zombie)."""


class StartSupersededError(ProducerFencedError):
    """A later start of the sink recorded its layout: this app's attempts may not commit any more
    (they could deliver what the newer start's workers deliver), so it stops."""

    _PATTERN = re.compile(r"StartSupersededError: (?P<line>[^\n]+)")

    @classmethod
    def find(cls, text: str) -> StartSupersededError | None:
        """The refusal named in ``text`` (a Spark task failure), or None: every retry of the batch
        would meet the same newer start, so the driver stops at the first."""
        match = cls._PATTERN.search(text)
        return None if match is None else cls(match["line"])


class CatalogNotFoundError(FanoutSinkError):
    """A read-only command was pointed at a SQLite catalog file that does not exist.

    Opening it would create an empty catalog and answer as if the sink had no table; only ``run``
    creates a catalog, so the others stop and name the path they looked at.
    """

    def __init__(self, name: str, path: str) -> None:
        self.cause = f"catalog {name!r}: {path} does not exist"
        self.fix = (
            "correct catalog.uri (a relative path is relative to the sink's YAML file), or start the "
            "sink once with `fanout-sink run`, the only command that creates a catalog"
        )
        super().__init__(f"{self.cause}; {self.fix}")


class ConfigError(FanoutSinkError):
    """The sink's YAML configuration is invalid; raised before anything starts.

    Each problem names the file, the YAML path, what is wrong and an example of a valid value.
    """

    def __init__(self, source: str, path: str, problem: str, fix: str = "") -> None:
        self.problems: list[tuple[str, str, str]] = [(path, problem, fix)]
        self.source = source
        super().__init__(self._render())

    @classmethod
    def many(cls, source: str, problems: list[tuple[str, str, str]]) -> ConfigError:
        error = cls(source, *problems[0])
        error.problems = list(problems)
        error.args = (error._render(),)
        return error

    def _render(self) -> str:
        lines = []
        for path, problem, fix in self.problems:
            line = f"{self.source}: {path}: {problem}"
            if fix:
                line += f"; {fix}"
            lines.append(line)
        return "\n".join(lines)


class RecordError(FanoutSinkError):
    """A record could not be decoded, routed or converted and ``errors.tolerance`` is ``none``.

    Raised on an executor, it reaches the driver only as text inside Spark's exception;
    :meth:`find` recovers it from there, so the app can stop with this message instead of a trace.
    The worker adds where a restart reads the partition again (:meth:`restarting_at`): the sink
    group's offset, or the slice's start when nothing of the partition is committed, never the
    record itself (issue 47 item 6: "a restart resumes at this record" while the next run read the
    partition from 0).
    """

    _PATTERN = re.compile(
        r"RecordError: record (?P<topic>[^\s\[]+)\[(?P<partition>\d+)\]@(?P<offset>\d+) "
        r"failed at (?P<stage>\w+): (?P<reason>[^\n]*)"
        r"(?:\n  the sink stopped: (?:(?P<nothing>nothing of )|\S+ is committed up to ).*?"
        r"a restart reads it again from offset (?P<restart>\d+))?"
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        stage: str,
        reason: str,
        restart: int | None = None,
        committed: bool = False,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.stage = stage
        self.reason = reason
        self.restart = restart
        """The offset a restart reads the partition from (None: not known where it was raised)."""
        self.committed = committed
        """Whether the sink group holds an offset of the partition (``restart`` is it)."""
        where = f"{topic}[{partition}]"
        if restart is None:
            stopped = "nothing of this record's slice was committed, and a restart stops at it again"
        else:
            held = (
                f"{where} is committed up to offset {restart}"
                if committed
                else f"nothing of {where} is committed yet"
            )
            stopped = (
                f"{held}, so a restart reads it again from offset {restart} and stops at this record again"
            )
        super().__init__(
            f"record {where}@{offset} failed at {stage}: {reason}\n"
            f"  the sink stopped: {stopped}\n"
            "  fix: correct the producer or the sink's config, or set errors.tolerance: all with a "
            "dead-letter.topic to divert such records"
        )

    def restarting_at(self, restart: int, committed: bool) -> RecordError:
        """This error, saying that a restart reads the partition from ``restart``: the sink group's
        offset (``committed``), else the start of the slice that failed."""
        return RecordError(
            self.topic, self.partition, self.offset, self.stage, self.reason, restart, committed
        )

    @classmethod
    def find(cls, text: str) -> RecordError | None:
        """The first record error named in ``text`` (e.g. a Spark task failure), or None."""
        match = cls._PATTERN.search(text)
        if match is None:
            return None
        restart = None if match["restart"] is None else int(match["restart"])
        return cls(
            match["topic"],
            int(match["partition"]),
            int(match["offset"]),
            match["stage"],
            match["reason"],
            restart,
            match["nothing"] is None,
        )


class BatchError(FanoutSinkError):
    """A micro-batch failed on its last attempt (or the coordinator stopped): the app stops with this
    one message; the failed task's traceback was logged once, where the batch failed."""


class SchemaError(FanoutSinkError):
    """An Avro schema (a file, or one from the Schema Registry) is unusable, or the registry unreachable."""


class UnknownSchemaIdError(SchemaError):
    """Values name schema ids the Schema Registry does not know (yet), none of them unknown for
    ``source.unknown-schema-id-timeout``: the registry may still learn them (a lagging follower, a
    restore), so the slice fails before its transaction and the batch is retried; records are
    dead-lettered only once their id has been unknown for that long.

    Raised on an executor, it reaches the driver only as text inside Spark's exception; :meth:`find`
    recovers the ids and when each was first seen (wall clock, comparable across processes), so the
    driver keeps retrying and tells the next attempt's tasks how long each id has been unknown.
    """

    _PATTERN = re.compile(r"schema ids \[(?P<since>[^\]]*)\] \(id@first seen")
    _SINCE = re.compile(r"(\d+)@(\d+(?:\.\d+)?)")
    NAMED = 100
    """At most this many ids (the first seen) are carried to the driver: a flood of junk ids stays
    one line; each task also remembers the ids it saw itself."""

    def __init__(self, since: dict[int, float], timeout_s: float, first: int = 0, record: str = "") -> None:
        self.since = since
        self.timeout_s = timeout_s
        self.first = first
        """The index of the first value naming a pending id, in the values decoded."""
        oldest = sorted(since.items(), key=lambda item: item[1])[: self.NAMED]
        shown = " ".join(f"{schema_id}@{seen:.3f}" for schema_id, seen in oldest)
        at = f" (first: record {record})" if record else ""
        super().__init__(
            f"schema ids [{shown}] (id@first seen, epoch seconds; {len(since)} in all) are unknown to "
            f"the Schema Registry{at}; the batch is retried until an id has been unknown for "
            f"source.unknown-schema-id-timeout ({timeout_s:g}s), then its records are dead-lettered\n"
            "  fix: register the schemas, or point source.schema-registry.url at the producers' registry; "
            "nothing of the slice was committed, so a retry or a restart reads it again"
        )

    def at(self, record: str) -> UnknownSchemaIdError:
        """The same error naming its first record (``topic[partition]@offset``)."""
        return UnknownSchemaIdError(self.since, self.timeout_s, self.first, record)

    @classmethod
    def find(cls, text: str) -> dict[int, float]:
        """The ids and first-seen times named in ``text`` (e.g. a Spark task failure); empty when none."""
        since: dict[int, float] = {}
        for match in cls._PATTERN.finditer(text):
            for schema_id, seen in cls._SINCE.findall(match["since"]):
                since[int(schema_id)] = min(float(seen), since.get(int(schema_id), float("inf")))
        return since


class TableError(FanoutSinkError):
    """A destination table could not be loaded, created or evolved."""


class PreflightError(FanoutSinkError):
    """A check before start-up failed: the broker, credentials, topics, catalog or warehouse is wrong.

    Raised before Spark starts or anything is created, so fixing the cause and running again is all
    it takes. ``cause`` is one line naming the YAML key involved; ``fix`` says what to change.
    """

    def __init__(self, cause: str, fix: str) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"{cause}\n  fix: {fix}")


class SourceReadError(FanoutSinkError):
    """A worker could not read its planned source range ``[start, end)`` of one partition.

    The range was planned from offsets the broker reported, so every offset in it must still be
    readable; a slice is never committed from fewer records than the range holds.
    """


class SourceDataLossError(SourceReadError):
    """Records of a planned source range were deleted before they were delivered (retention,
    delete-records): the same condition Spark's Kafka source stops on with ``failOnDataLoss=true``."""

    def __init__(self, topic: str, partition: int, start: int, end: int, log_start: int, group: str) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.log_start, self.group = log_start, group
        super().__init__(
            f"source {topic}[{partition}] lost records the sink has not delivered: the slice to deliver is "
            f"[{start}, {end}) but the log now starts at offset {log_start}; offsets "
            f"{start}..{log_start - 1} were deleted by the topic's retention (retention.ms / "
            "retention.bytes) or by delete-records.\n"
            "  fix: give the source topic a retention longer than the sink's longest lag. The sink never "
            "skips undelivered records by itself; to go on without them, stop the app, run "
            f"`kafka-consumer-groups --bootstrap-server <brokers> --group {group} "
            f"--topic {topic}:{partition} --reset-offsets --to-offset {log_start} --execute`, "
            "move the Spark checkpoint aside and restart"
        )


class TopicRecreatedError(FanoutSinkError):
    """A source topic was deleted and created again under the same name: the positions the sink
    recorded belong to the old topic (another topic id) and say nothing about the new one's records.

    ``running`` marks the error a worker raises when Spark kept planning the new topic from the old
    topic's positions: only start-up planning can move Spark back to the new topic's beginning.
    """

    def __init__(self, topic: str, recorded_id: str, current_id: str, running: bool = False) -> None:
        self.topic, self.recorded_id, self.current_id = topic, recorded_id, current_id
        if running:
            fix = (
                "restart the app: its start-up planning moves Spark's checkpoint aside and reads the new "
                "topic from its beginning (source.recreated-topic-offsets: earliest, the default) or stops "
                "(fail)"
            )
        else:
            fix = (
                "if the new topic's records are new, set source.recreated-topic-offsets: earliest and "
                "restart to read it from its beginning; if it holds a copy of records the sink already "
                "delivered (a restore, a mirror), move their rows aside first or they land twice"
            )
        super().__init__(
            f"source topic {topic!r} was deleted and recreated: the sink delivered positions of topic id "
            f"{recorded_id}, the topic now has id {current_id}, and none of its records is delivered yet.\n"
            f"  fix: {fix}"
        )


class CatalogSettingsError(FanoutSinkError):
    """The ``catalog:`` section names no catalog that can be loaded: no ``uri`` (and no catalog of that
    name in PyIceberg's configuration), or a ``uri`` scheme that catalog type does not speak.
    ``cause`` is one line; ``fix`` says what to change."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"{cause}\n  fix: {fix}")
