"""An Iceberg fast append that keeps every data file under the partition spec it was written with.

Workers write files under the table's default spec at write time; the coordinator appends them
later, possibly after someone changed the partition spec. PyIceberg 0.12's fast append writes all
added files into one manifest of the table's *current* default spec (and summarises their
partitions with it), which fails on files of an older spec, every round, for good. Iceberg itself
allows files of any spec the table still knows: Java's ``FastAppend`` writes one manifest per spec.
This does the same: the files keep their own partition values and stay prunable under their spec.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry, ManifestEntryStatus, ManifestFile, ManifestWriter
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _FastAppendFiles


def by_spec(files: Iterable[DataFile]) -> dict[int, list[DataFile]]:
    """``files`` grouped by the partition spec they were written with, in spec id order."""
    grouped: dict[int, list[DataFile]] = defaultdict(list)
    for added in files:
        grouped[added.spec_id].append(added)
    return dict(sorted(grouped.items()))


class SpecPreservingAppend(_FastAppendFiles):
    """``_FastAppendFiles`` with one added manifest per partition spec id of the added files."""

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(
            operation=Operation.APPEND,
            transaction=transaction,
            io=io,
            snapshot_properties=snapshot_properties,
        )

    def _by_spec(self) -> dict[int, list[DataFile]]:
        return by_spec(self._added_data_files)

    def _manifests(self) -> list[ManifestFile]:
        added = [
            self._added_manifest(self.new_manifest_writer(self.spec(spec_id)), files)
            for spec_id, files in self._by_spec().items()
        ]
        return self._process_manifests(added + self._existing_manifests())

    def _added_manifest(self, writer: ManifestWriter, files: list[DataFile]) -> ManifestFile:
        """``files`` as ADDED entries of this snapshot (sequence numbers inherited at commit)."""
        with writer:
            for data_file in files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
        return writer.to_manifest_file()

    def _collect(self, collector: SnapshotSummaryCollector, schema: Schema) -> None:
        """Count every added file into the summary, each under its own spec."""
        self._count(collector, schema, self._by_spec())

    def _count(
        self, collector: SnapshotSummaryCollector, schema: Schema, grouped: dict[int, list[DataFile]]
    ) -> None:
        for spec_id, files in grouped.items():
            for added in files:
                collector.add_file(data_file=added, partition_spec=self.spec(spec_id), schema=schema)

    def _summary(self, snapshot_properties: dict[str, str] | None = None) -> Summary:
        metadata = self._transaction.table_metadata
        limit = int(
            metadata.properties.get(
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
            )
        )
        collector = SnapshotSummaryCollector(partition_summary_limit=limit)
        self._collect(collector, metadata.schema())
        parent = (
            metadata.snapshot_by_id(self._parent_snapshot_id)
            if self._parent_snapshot_id is not None
            else None
        )
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **(snapshot_properties or {})),
            previous_summary=parent.summary if parent is not None else None,
        )
