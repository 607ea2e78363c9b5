"""The sink's snapshot producers: :class:`SpecPreservingAppend` (one manifest per partition spec of
the added files) and :class:`RowDelta` (data and position-delete manifests in one snapshot).

What it reaches into: ``pyiceberg.table.update.snapshot._FastAppendFiles``, subclassed by
:class:`SpecPreservingAppend` (and so :class:`RowDelta`), overriding ``_manifests``, ``_summary``,
``_existing_manifests`` (the parent's manifest list read with :mod:`.manifests`' reader),
``new_manifest_writer`` (:mod:`.manifests`' writers) and ``_refresh_for_retry``, and reading
``_added_data_files``, ``_snapshot_id``, ``_parent_snapshot_id``, ``_operation``, ``_compression``,
``_process_manifests``, ``_io``, ``_transaction`` and ``_transaction._table``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _FastAppendFiles

from fanout_sink.pyiceberg_internals.manifests import (
    DeleteManifestWriter,
    manifest_writer,
    read_manifest_list,
)


def by_spec(files: Iterable[DataFile]) -> dict[int, list[DataFile]]:
    """``files`` grouped by the partition spec they were written with, in spec id order."""
    grouped: dict[int, list[DataFile]] = defaultdict(list)
    for added in files:
        grouped[added.spec_id].append(added)
    return dict(sorted(grouped.items()))


class SpecPreservingAppend(_FastAppendFiles):
    """An Iceberg fast append that keeps every data file under the partition spec it was written with.

    Workers write files under the table's default spec at write time; the coordinator appends them
    later, possibly after someone changed the partition spec. PyIceberg 0.12's fast append writes all
    added files into one manifest of the table's *current* default spec (and summarises their
    partitions with it), which fails on files of an older spec, every round, for good. Iceberg itself
    allows files of any spec the table still knows: Java's ``FastAppend`` writes one manifest per
    spec. This does the same: ``_FastAppendFiles`` with one added manifest per partition spec id of
    the added files, so the files keep their own partition values and stay prunable under their spec.
    """

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(
            operation=Operation.APPEND,
            transaction=transaction,
            io=io,
            snapshot_properties=snapshot_properties,
        )

    def _by_spec(self) -> dict[int, list[DataFile]]:
        return by_spec(self._added_data_files)

    def _existing_manifests(self) -> list[ManifestFile]:
        """The parent snapshot's manifests that still hold live files, as in PyIceberg's fast append,
        read with :func:`read_manifest_list`."""
        if self._parent_snapshot_id is None:
            return []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        if parent is None:
            raise ValueError(f"Snapshot could not be found: {self._parent_snapshot_id}")
        return [
            manifest
            for manifest in read_manifest_list(self._io.new_input(parent.manifest_list))
            if manifest.has_added_files()
            or manifest.has_existing_files()
            or manifest.added_snapshot_id == self._snapshot_id
        ]

    def new_manifest_writer(self, spec: PartitionSpec) -> ManifestWriter:
        return manifest_writer(
            self._transaction.table_metadata.format_version,
            spec,
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )

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


class RowDelta(SpecPreservingAppend):
    """One snapshot that adds data files (each under its own spec) and position-delete files.

    Its commit asserts that the table's branch still points at the snapshot the transaction started
    from, so deletes resolved against that snapshot can never land on another one."""

    def __init__(self, transaction: Transaction, io: FileIO, snapshot_properties: dict[str, str]) -> None:
        super().__init__(transaction, io, snapshot_properties)
        self._added_delete_files: list[DataFile] = []

    def __enter__(self) -> RowDelta:
        return self

    def _refresh_for_retry(self) -> None:
        """Refuse PyIceberg's retry: it would rebase this snapshot onto a newer head, but the deletes
        (and which rows count as new) were resolved against the old one. The caller resolves again."""
        raise CommitFailedException(
            f"table {'.'.join(self._transaction._table.name())} changed since its changes were resolved "
            f"against snapshot {self._parent_snapshot_id}; resolve them again on the reloaded table"
        )

    def add_delete_file(self, delete_file: DataFile) -> RowDelta:
        if delete_file.content != DataFileContent.POSITION_DELETES:
            raise ValueError(f"{delete_file.file_path} is not a position-delete file")
        self._added_delete_files.append(delete_file)
        self._operation = Operation.OVERWRITE
        return self

    def _deletes_by_spec(self) -> dict[int, list[DataFile]]:
        return by_spec(self._added_delete_files)

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        for spec_id, files in self._deletes_by_spec().items():
            writer = DeleteManifestWriter(
                spec=self.spec(spec_id),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            )
            manifests.append(self._added_manifest(writer, files))
        return manifests

    def _collect(self, collector: SnapshotSummaryCollector, schema: Schema) -> None:
        super()._collect(collector, schema)
        self._count(collector, schema, self._deletes_by_spec())
