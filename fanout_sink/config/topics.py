"""The sink's own topics: ``control:`` (the control topic and the commit cadence) and
``dead-letter:``, with ``errors:`` (whether a bad record goes to the latter or stops the sink)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from fanout_sink.config.fields import Duration, Section
from fanout_sink.kafka.topics import TopicSettings


class ReplicatedTopic(Section):
    """Replication of one of the sink's own topics. Unset: as durable as the source offsets (the
    broker's ``offsets.topic.replication.factor`` and ``transaction.state.log.min.isr``, capped at
    the number of brokers); an existing topic below these values stops the sink at start."""

    replication_factor: int | None = Field(default=None, ge=1, examples=[3])
    min_insync_replicas: int | None = Field(default=None, ge=1, examples=[2])

    @model_validator(mode="after")
    def _replicas(self) -> ReplicatedTopic:
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise ValueError(
                f"min-insync-replicas {isr} is more than replication-factor {rf}: no write could ever "
                f"succeed; e.g. replication-factor: 3, min-insync-replicas: 2"
            )
        return self


DEFAULT_CONTROL_RETENTION_MS = 7 * 24 * 3600 * 1000
"""7 days: Kafka's own default ``log.retention.hours`` and ``offsets.retention.minutes``, so the
control topic forgets no sooner than the broker forgets the sink's group offsets."""
MIN_CONTROL_RETENTION_MS = 3600 * 1000


class ControlSettings(ReplicatedTopic):
    """``control:`` the sink's control topic and its commit cadence.

    The control topic grows by one record per data file (its column statistics) plus a few events per
    round. A restart reads only its tail: the events a table still needs (from the low watermark on)
    and the newest whole round, which carries every delivered position forward. So it is created with
    a finite retention (``retention-ms``, Kafka's ``retention.ms``: 7 days by default; -1 keeps every
    event) and ``cleanup.policy=delete``. What that retention must outlast: a table failing round
    after round (its events stay pending) and a sink down after a crash that left events pending; a
    sink stopped cleanly may stay down longer (docs/design.md, "The control topic's tail").
    """

    topic: str | None = Field(default=None, examples=["shop-events-control"])
    commit_interval: Duration = Field(default=timedelta(seconds=30), examples=["30s"])
    commit_min_interval: Duration = Field(default=timedelta(seconds=2), examples=["2s"])
    """The shortest time between the starts of two commit rounds. A round starts as soon as every
    planned range of a micro-batch has reported (``commit-interval`` is only the upper bound), so
    without a floor a backlog read in many small batches would make a snapshot per table every few
    hundred milliseconds. Capped at ``commit-interval``."""
    commit_timeout: Duration = Field(default=timedelta(seconds=60), examples=["60s"])
    distributed_commit_min_tables: int = Field(default=50, ge=1, examples=[50])
    """A round committing at least this many tables runs its table commits as one Spark job over the
    executors' cores (spark/executor_commits.py); smaller rounds commit on the driver, where a job's
    scheduling would cost more than it spreads."""
    offsets_refresh_interval: Duration | None = Field(default=None, examples=["6h"])
    """How often the coordinator re-commits an idle partition's sink-group offset (the group is never
    joined, so the broker expires each offset ``offsets.retention.minutes`` after its last commit).
    Unset: a quarter of the broker's ``offsets.retention.minutes``."""
    retention_ms: int = Field(default=DEFAULT_CONTROL_RETENTION_MS, ge=-1, examples=[604800000, -1])
    """Kafka's ``retention.ms`` for a control topic the sink creates; -1 keeps every event. At
    least an hour when finite: rounds run every ``commit-interval`` and each one's events must
    survive until the next restart reads them."""
    retention_bytes: int = Field(default=-1, ge=-1, examples=[-1])

    @model_validator(mode="after")
    def _check_cadence(self) -> ControlSettings:
        if 0 <= self.retention_ms < MIN_CONTROL_RETENTION_MS:
            raise ValueError(
                f"retention-ms {self.retention_ms} is shorter than an hour: a restart reads the control "
                "topic's events since the last round, and a table that fails for a few rounds holds "
                "events back; e.g. retention-ms: 604800000 (7 days), or -1 to keep every event"
            )
        if "commit_min_interval" in self.model_fields_set and self.commit_min_interval > self.commit_interval:
            raise ValueError(
                f"commit-min-interval ({self.commit_min_interval}) is longer than commit-interval "
                f"({self.commit_interval}): rounds could never be that far apart; e.g. commit-interval: "
                "30s, commit-min-interval: 2s"
            )
        return self

    def topic_settings(self) -> TopicSettings:
        """How the control topic is created and checked (never compacted: every event counts)."""
        return TopicSettings(
            section="control",
            config={
                "cleanup.policy": "delete",
                "retention.ms": str(self.retention_ms),
                "retention.bytes": str(self.retention_bytes),
            },
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )


class DeadLetterSettings(ReplicatedTopic):
    """``dead-letter:`` where records that cannot be delivered go (retention: the broker's default)."""

    topic: str = Field(examples=["shop-events-dlq"])
    connect_headers: bool = Field(default=False, examples=[True])
    """Also write Kafka Connect's ``__connect.errors.*`` headers (Connect's
    ``errors.deadletterqueue.context.headers.enable``), so existing DLQ tooling reads ours."""

    def topic_settings(self) -> TopicSettings:
        return TopicSettings(
            section="dead-letter",
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )


class ErrorSettings(Section):
    """``errors.tolerance``: ``all`` dead-letters a bad record, ``none`` stops the sink.

    Unset, it is ``all`` when a ``dead-letter`` topic is configured and ``none`` otherwise.
    """

    tolerance: Literal["none", "all"] | None = Field(default=None, examples=["all"])
