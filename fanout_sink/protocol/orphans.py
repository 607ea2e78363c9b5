"""Orphan file cleanup with the sink's own safety rules, without Spark.

Iceberg's ``remove_orphan_files`` knows only the table: a file under its location that no snapshot
and no metadata file names is an orphan once it is older than a safety age. Next to this sink that
is not enough: a worker's data files are announced by a committed ``DataWritten`` event on the
control topic and appended by the coordinator only at its next round (or rounds later, while a table
fails), so for a while a file nothing in the table names is the only copy of delivered rows. Such a
file is *pending*, and pending files are never removed, whatever their age.

A file is removed only if it is (1) under the table location, (2) older than the safety age by
modification time, (3) not pending: named by no ``DataWritten`` event at or above the coordinator
group's committed low watermark (read ``read_committed`` to the end), and (4) not reachable: named by
no snapshot of this table (manifest lists, manifests, data and delete files), by no metadata JSON in
the log, statistics file or ``version-hint``, nor by a table of the same catalog whose location
overlaps. Events of aborted worker transactions are invisible to ``read_committed``, so the data files
of aborted attempts are exactly what this removes, together with leftovers of failed catalog commits.

The order of the reads is what makes this safe next to a running sink: files are listed first, then
the control topic is read, then the table metadata is loaded. A file old enough at listing time that
the coordinator commits meanwhile is either still pending at the control read or already in the
metadata loaded after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from fanout_sink.errors import FanoutSinkError
from fanout_sink.protocol import events as ev
from fanout_sink.protocol import recovery
from fanout_sink.protocol.channel import ControlReader, SinkChannel

log = logging.getLogger(__name__)

_S3_SCHEMES = {"s3", "s3a", "s3n"}
_VERSION_HINT = "version-hint.text"


def normalise(path: str) -> str:
    """One spelling per file: ``file:/x``, ``file:///x`` and ``/x`` are ``/x``; ``s3a://`` and
    ``s3n://`` are ``s3://`` (Spark and PyIceberg spell the same file differently)."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        return "/" + path[len("file:") :].lstrip("/") if path.startswith("file:") else path
    scheme = scheme.lower()
    if scheme == "file":
        return "/" + rest.lstrip("/")
    if scheme in _S3_SCHEMES:
        scheme = "s3"
    return f"{scheme}://{rest}"


@dataclass(frozen=True)
class ListedFile:
    path: str
    """As the store lists it, with the table location's scheme (what ``FileIO.delete`` takes)."""
    modified_s: float


@dataclass(frozen=True)
class OrphanResult:
    """What one cleanup of one table found and did."""

    listed: int
    """Files under the table location."""
    removed: tuple[str, ...] = ()
    """Orphans removed (or, in a dry run, that would be)."""
    kept_pending: int = 0
    """Unreferenced, old enough, but named by a control event still to be committed."""
    kept_fresh: int = 0
    """Unreferenced but younger than the safety age."""
    failed: tuple[str, ...] = ()
    """Orphans whose deletion failed (logged; tried again at the next run)."""
    error: str | None = None
    """Why the cleanup of this table did not run (listing or loading failed)."""
    refused: str | None = None
    """Why the cleanup of this table must not run (``gc.enabled=false``)."""


GC_DISABLED = (
    "gc.enabled is false: the table's files may belong to another table too (registered in a second "
    "catalog, a branch), so nothing is deleted, as Iceberg's own procedures refuse"
)


def gc_disabled(table: Table) -> bool:
    """Whether the table forbids deleting its files (Iceberg's ``gc.enabled``, true by default)."""
    return table.metadata.properties.get("gc.enabled", "true").strip().lower() == "false"


def list_files(io: FileIO, location: str) -> list[ListedFile]:
    """Every file under ``location`` with its modification time, through the table's own FileIO
    settings (local, s3:// with the catalog's endpoint and keys)."""
    if not isinstance(io, PyArrowFileIO):
        raise FanoutSinkError(
            f"orphan cleanup lists files through pyarrow, but the table's FileIO is {type(io).__name__}\n"
            "  fix: use the default PyArrowFileIO (catalog property py-io-impl) or skip orphan cleanup"
        )
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    prefix = f"{scheme}://" if scheme != "file" else ""
    try:
        infos = filesystem.get_file_info(
            pafs.FileSelector(path.rstrip("/"), recursive=True, allow_not_found=True)
        )
    except FileNotFoundError:
        return []
    return [
        ListedFile(prefix + info.path, info.mtime.timestamp() if info.mtime is not None else time.time())
        for info in infos
        if info.type == pafs.FileType.File
    ]


def pending_files(channel: SinkChannel) -> set[str]:
    """Normalised paths of every data file (and deleted-keys file) announced by a committed
    ``DataWritten`` event of the channel's sink at or above the coordinator group's low watermark:
    what the coordinator may still append or read."""
    reader = ControlReader(channel)
    try:
        recovery.seek_to_low_watermark(reader)
        return {
            normalise(path)
            for item in reader.read_until(reader.end_offset())
            if isinstance(item.event.payload, ev.DataWritten)
            for path in [
                *(record.file_path for record in item.event.payload.files),
                *(keys.file_path for keys in item.event.payload.deleted_keys),
            ]
        }
    finally:
        reader.close()


def reachable_files(table: Table) -> set[str]:
    """Normalised paths of every file the table's metadata names, across all its snapshots."""
    metadata = table.metadata
    found = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    found.update(stats.statistics_path for stats in metadata.statistics)
    found.update(stats.statistics_path for stats in metadata.partition_statistics)
    seen_manifests: set[str] = set()
    for snapshot in metadata.snapshots:
        found.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            found.update(
                entry.data_file.file_path
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
            )
    found |= seen_manifests
    return {normalise(path) for path in found}


def _checksum_of(name: str) -> str | None:
    """The file a Hadoop checksum file ``<dir>/.<name>.crc`` belongs to; None for other files."""
    folder, _, base = name.rpartition("/")
    if base.startswith(".") and base.endswith(".crc"):
        return f"{folder}/{base[1:-4]}"
    return None


def _overlaps(a: str, b: str) -> bool:
    a, b = normalise(a).rstrip("/") + "/", normalise(b).rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def overlapping(table: Table, others: Iterable[Table]) -> list[Table]:
    """The ``others`` whose location is this table's, inside it or around it (a table renamed away
    keeps its location, and a new table of the old name gets the same one)."""
    return [
        other
        for other in others
        if other.metadata.table_uuid != table.metadata.table_uuid
        and _overlaps(other.location(), table.location())
    ]


def clock_skew_margin(older_than: timedelta) -> timedelta:
    """How much older than ``older_than`` an orphan must look: a tenth of the age, at most 10 minutes
    (a store whose clock runs ahead makes fresh files look old)."""
    return min(older_than / 10, timedelta(minutes=10))


def remove_orphans(
    table: Table,
    older_than: timedelta,
    pending: set[str],
    neighbours: Sequence[Table] = (),
    dry_run: bool = False,
    listed: list[ListedFile] | None = None,
) -> OrphanResult:
    """Remove the orphans of ``table`` (see the module docstring for the rules).

    ``pending`` comes from :func:`pending_files`, read AFTER ``listed`` (the listing, taken here when
    not given) and BEFORE ``table`` was loaded; ``neighbours`` are tables whose location overlaps.
    """
    if gc_disabled(table):
        return OrphanResult(len(listed or ()), refused=GC_DISABLED)
    files = listed if listed is not None else list_files(table.io, table.location())
    # Old enough by a margin: file times come from the store's clock, the cut-off from this host's.
    cutoff = time.time() - older_than.total_seconds() - clock_skew_margin(older_than).total_seconds()
    reachable = reachable_files(table)
    for neighbour in neighbours:
        reachable |= reachable_files(neighbour)
    removed, failed = [], []
    kept_pending = kept_fresh = 0
    listed_names = {normalise(f.path) for f in files}
    gone: set[str] = set()
    # Checksums last: Hadoop's local file system (Spark's writes) keeps `.<name>.crc` beside each
    # file; one is an orphan only when its file is gone or goes now.
    for listed_file in sorted(files, key=lambda f: _checksum_of(normalise(f.path)) is not None):
        name = normalise(listed_file.path)
        if name in reachable or name.endswith("/" + _VERSION_HINT):
            continue
        checksummed = _checksum_of(name)
        if checksummed is not None and checksummed in listed_names and checksummed not in gone:
            continue
        if listed_file.modified_s > cutoff:
            kept_fresh += 1
            continue
        if name in pending:
            kept_pending += 1
            continue
        if not dry_run:
            try:
                table.io.delete(listed_file.path)
            except FileNotFoundError:  # deleted since the listing (another process's expiry): not ours
                gone.add(name)
                continue
            except OSError as exc:
                log.warning("could not delete orphan %s of %s: %s", listed_file.path, table.name(), exc)
                failed.append(listed_file.path)
                continue
        gone.add(name)
        removed.append(listed_file.path)
    return OrphanResult(len(files), tuple(removed), kept_pending, kept_fresh, tuple(failed))


def _all_tables(catalog: Catalog) -> list[Table]:
    """Every table of the catalog that can be loaded now (one dropped since it was listed is not
    there to protect, and must not fail the cleanup of all the others)."""
    found = []
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            try:
                found.append(catalog.load_table(identifier))
            except NoSuchTableError:
                continue
    return found


def clean_tables(
    catalog: Catalog,
    older_than: Mapping[str, timedelta],
    pending: Callable[[], set[str]],
    dry_run: bool = False,
) -> dict[str, OrphanResult]:
    """Remove the orphans of each table named in ``older_than`` (identifier -> its safety age).

    The order is the safe one (module docstring): every table's files are listed, then ``pending``
    reads the control topic once, then the tables are loaded again. A table that fails gets an
    ``OrphanResult`` with its ``error``; the others go on.
    """
    results: dict[str, OrphanResult] = {}
    listed: dict[str, list[ListedFile]] = {}
    for identifier in older_than:
        try:
            table = catalog.load_table(identifier)
            if gc_disabled(table):
                results[identifier] = OrphanResult(0, refused=GC_DISABLED)
                continue
            listed[identifier] = list_files(table.io, table.location())
        except Exception as exc:  # one table's store problem must not stop the others
            results[identifier] = OrphanResult(0, error=f"{type(exc).__name__}: {exc}")
    if not listed:
        return results
    protected = pending()
    everything = _all_tables(catalog)
    for identifier, files in listed.items():
        try:
            table = catalog.load_table(identifier)
            results[identifier] = remove_orphans(
                table, older_than[identifier], protected, overlapping(table, everything), dry_run, files
            )
        except Exception as exc:  # as above
            results[identifier] = OrphanResult(len(files), error=f"{type(exc).__name__}: {exc}")
    return results
