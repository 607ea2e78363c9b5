"""``maintenance:`` and ``tables.<t>.maintenance:``: when and how the sink's tables are compacted,
rewritten, expired and cleaned of orphans."""

from __future__ import annotations

import re
from datetime import timedelta

from pydantic import Field, field_validator

from fanout_sink.config.fields import Duration, Section

_SORT_TERM = re.compile(r"^\s*[A-Za-z_][\w.]*(\s+(asc|desc))?(\s+nulls\s+(first|last))?\s*$", re.IGNORECASE)


class MaintenanceSettings(Section):
    """``maintenance:`` (defaults for every table of the sink) and ``tables.<t>.maintenance:``
    (overrides of the same keys): compaction, manifest rewrite, snapshot expiry and orphan cleanup.

    Key names are Iceberg's where Iceberg has one. ``interval`` set: ``run`` also maintains the tables
    on that schedule; unset: only ``fanout-sink maintain`` does. ``target-file-size-bytes`` unset: the
    table's ``write.target-file-size-bytes`` (else Iceberg's 512 MB); ``max-snapshot-age`` and
    ``min-snapshots-to-keep`` unset: the table's ``history.expire.max-snapshot-age-ms`` and
    ``history.expire.min-snapshots-to-keep`` (else 5 days and 1, Iceberg's defaults).

    ``max-duration`` (top level; a table's own is not read): a run that has taken that long starts no
    new table, finishes the one under way, and ends with a line naming the tables left. Each run takes
    the tables that gain most first (``fanout_sink/maintenance/priority.py``), so those left keep
    their gain and come first next time. Unset: every table, however long that takes.

    Change tables (merge-on-read position deletes): compaction also rewrites a data file with at least
    ``delete-file-threshold`` delete files, or whose file-scoped deletes cover at least
    ``delete-ratio-threshold`` of its rows (Iceberg's ``rewrite_data_files`` options). The default 1
    folds every delete at each run, unlike Iceberg's (never): PyIceberg reads all delete files of a
    scan and cannot push filters into data files that have deletes, so each delete left costs every
    reader, and a table that keeps receiving changes would otherwise grow delete files without end.
    Raise it for large tables with sparse changes, where rewriting a file for a few deletes costs more
    than reading them.
    """

    interval: Duration | None = Field(default=None, examples=["1h"])
    max_duration: Duration | None = Field(default=None, examples=["10m"])
    target_file_size_bytes: int | None = Field(default=None, ge=1, examples=[134217728])
    min_input_files: int = Field(default=5, ge=1, examples=[5])
    sort_order: str | None = Field(default=None, examples=["ts, id DESC NULLS LAST"])
    rewrite_manifests_min_count: int = Field(default=100, ge=1, examples=[100])
    max_snapshot_age: Duration | None = Field(default=None, examples=["5d"])
    min_snapshots_to_keep: int | None = Field(default=None, ge=1, examples=[1])
    orphan_older_than: Duration = Field(default=timedelta(days=3), examples=["3d"])
    delete_file_threshold: int = Field(default=1, ge=1, examples=[1])
    delete_ratio_threshold: float = Field(default=0.3, gt=0, le=1, examples=[0.3])

    @field_validator("interval", "orphan_older_than", "max_duration")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"must be positive, not {value.total_seconds():g}s; e.g. 1h")
        return value

    @field_validator("max_snapshot_age")
    @classmethod
    def _not_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError(f"must not be negative, not {value.total_seconds():g}s; e.g. 5d")
        return value

    @field_validator("sort_order")
    @classmethod
    def _sort_order(cls, value: str | None) -> str | None:
        if value is not None and not all(_SORT_TERM.match(term) for term in value.split(",")):
            raise ValueError(
                f"not a sort order {value!r}; write columns with optional ASC|DESC and NULLS FIRST|LAST, "
                'e.g. "ts, id DESC NULLS LAST"'
            )
        return value

    def overridden_by(self, other: MaintenanceSettings | None) -> MaintenanceSettings:
        """These settings with the keys ``other`` sets explicitly (a table's own section) replaced."""
        if other is None:
            return self
        return self.model_copy(update={name: getattr(other, name) for name in other.model_fields_set})
