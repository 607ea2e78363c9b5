"""A slice: one source topic-partition's planned offset range, the worker's commit unit, and what
delivering it did.

The driver plans slices (``spark/batch.py``), a task delivers one (``spark/task.py``), the worker
commits it in one transaction (``protocol/worker.py``) after writing its files
(``protocol/slice_writer.py``), and recovery restores its partition's position when the sink group
lost it (``recovery.restore_in_slices``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Slice:
    """The offsets ``[start, end)`` of one source topic-partition, as planned.

    ``end`` is the planned end offset, never last record + 1: offsets have holes. ``topic_id`` is
    the topic's id when the batch was planned (the driver asks once per batch); without it the
    worker asks the broker.
    """

    topic: str
    partition: int
    start: int
    end: int
    topic_id: str | None = None

    @property
    def label(self) -> str:
        """``topic[partition]``, as messages name a source partition."""
        return f"{self.topic}[{self.partition}]"

    def __str__(self) -> str:
        return f"{self.label} [{self.start}, {self.end})"


@dataclass
class SliceResult:
    """What one ``commit_slice`` did; the counts reconcile (invariant I5) per slice:
    ``records_in - skipped_delivered = sum(rows, counted per route) + dead_lettered + filtered``
    when every record goes to exactly one table. ``records_in`` counts the records read: a source
    reads from the delivered offset on, so delivered records are neither read nor counted; records
    handed in already read (a table) are all counted, the delivered ones in ``skipped_delivered``."""

    slice: Slice
    committed_before: int | None
    records_in: int = 0
    skipped_delivered: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    deleted_keys: dict[str, int] = field(default_factory=dict)
    """Per change table, the keys the slice deletes (resolved against the table at commit)."""
    dead_lettered: int = 0
    filtered: int = 0
    transaction_committed: bool = False
