"""Files of a local (or NFS-mounted) warehouse made durable before anything can reference them.

The exactly-once protocol publishes data file paths in a Kafka transaction (worker) and manifest,
manifest list and ``metadata.json`` paths in a catalog commit (coordinator). Both are durable once
acknowledged; the files they name must be too, or a power loss or kernel crash leaves a committed
reference to a file that is empty or missing. Object stores make a file durable when its upload
completes; a local filesystem does that only on ``fsync``. So every file written through the
sink's FileIO is fsynced when its stream is closed (every PyIceberg writer closes its stream before it
returns the file), and so is its directory entry, including directories the write created.

A worker closes one small file per table of a partition group (thousands at fan-out scale), and
fsyncing each as it closed, with its directory, cost ~2 ms of wall time a file, mostly waiting for
the disk: a quarter of a slice at 5,000 tables. So a writer of data files may close them within
:func:`syncs_deferred` and fsync them all at once before their transaction (:func:`fsync_all`: on a
few threads, since ``fsync`` releases the GIL and the filesystem's journal commits many together,
~0.2 ms a file; each directory once). Either way every file and entry is synced before anything can
name it.

The FileIO itself, ``DurableFileIO``, subclasses PyIceberg's ``PyArrowFileIO`` and so lives in
:mod:`fanout_sink.pyiceberg_internals.fileio`; ``catalog.load_catalog`` selects it through the catalog
property ``py-io-impl`` when the warehouse is local and the user chose no FileIO; other schemes are
written as ``PyArrowFileIO`` writes them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from pyiceberg.io import OutputStream

SYNC_THREADS = 8
"""Threads :func:`fsync_all` fsyncs on (more did not help on a local disk)."""

_deferred: ContextVar[list[str] | None] = ContextVar("fanout_sink_syncs_deferred", default=None)
"""Where this thread's closed files' paths go instead of being fsynced (:func:`syncs_deferred`)."""


def fsync_path(path: str) -> None:
    """``fsync`` a file or a directory by path (any descriptor of an inode flushes the inode)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def syncs_deferred(paths: list[str]) -> Iterator[None]:
    """Files closed within the block on this thread are not fsynced as they close: their paths and
    their directories' are added to ``paths``, which the caller must pass to :func:`fsync_all` before
    anything names the files. Only around the close of a writer's own files: a catalog commit within
    would name a file not synced yet. Files closed on other threads are fsynced as they close."""
    token = _deferred.set(paths)
    try:
        yield
    finally:
        _deferred.reset(token)


def fsync_all(paths: list[str]) -> None:
    """``fsync`` every path once, on up to :data:`SYNC_THREADS` threads; the first error is raised."""
    unique = list(dict.fromkeys(paths))
    if len(unique) <= 1:
        for path in unique:
            fsync_path(path)
        return
    threads = min(SYNC_THREADS, len(unique))

    def sync(share: list[str]) -> None:
        for path in share:
            fsync_path(path)

    with ThreadPoolExecutor(threads, thread_name_prefix="fsync") as pool:
        for done in [pool.submit(sync, unique[i::threads]) for i in range(threads)]:
            done.result()


class SyncingStream:
    """An output stream that, once closed, fsyncs its file and the directory entries it created."""

    def __init__(self, stream: OutputStream, path: str, new_dirs: list[str]) -> None:
        self._stream = stream
        self._path = path
        self._new_dirs = new_dirs
        self._synced = False

    def write(self, data: bytes) -> int:
        return self._stream.write(data)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        self._stream.close()
        if self._synced:
            return
        self._synced = True
        # The file, its own entry, then the entry of each directory this write created, parent first up.
        paths = [self._path, os.path.dirname(self._path), *(os.path.dirname(d) for d in self._new_dirs)]
        deferred = _deferred.get()
        if deferred is not None:
            deferred += paths
            return
        for path in paths:
            fsync_path(path)

    def __getattr__(self, name: str) -> Any:
        # tell(), flush(), closed ...: what pyarrow's PythonFile asks of a writable file.
        return getattr(self._stream, name)

    def __enter__(self) -> SyncingStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
