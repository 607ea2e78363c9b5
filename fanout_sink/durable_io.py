"""Files of a local (or NFS-mounted) warehouse made durable before anything can reference them.

The exactly-once protocol publishes data file paths in a Kafka transaction (worker) and manifest,
manifest list and ``metadata.json`` paths in a catalog commit (coordinator). Both are durable once
acknowledged; the files they name must be too, or a power loss or kernel crash leaves a committed
reference to a file that is empty or missing. Object stores make a file durable when its upload
completes; a local filesystem does that only on ``fsync``. So every file written through the
sink's FileIO is fsynced when its stream is closed (every PyIceberg writer closes its stream before it
returns the file), and so is its directory entry, including directories the write created.

The FileIO itself, ``DurableFileIO``, subclasses PyIceberg's ``PyArrowFileIO`` and so lives in
:mod:`fanout_sink.pyiceberg_internals.fileio`; ``catalog.load_catalog`` selects it through the catalog
property ``py-io-impl`` when the warehouse is local and the user chose no FileIO; other schemes are
written as ``PyArrowFileIO`` writes them.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from pyiceberg.io import OutputStream


def fsync_path(path: str) -> None:
    """``fsync`` a file or a directory by path (any descriptor of an inode flushes the inode)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        fsync_path(self._path)
        # The file's own entry, then the entry of each directory this write created, parent first up.
        for directory in [os.path.dirname(self._path), *(os.path.dirname(d) for d in self._new_dirs)]:
            fsync_path(directory)

    def __getattr__(self, name: str) -> Any:
        # tell(), flush(), closed ...: what pyarrow's PythonFile asks of a writable file.
        return getattr(self._stream, name)

    def __enter__(self) -> SyncingStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
