"""``DurableFileIO``: PyIceberg's ``PyArrowFileIO`` whose local files are fsynced when closed.

``py-io-impl`` selects it by class path (``fanout_sink.catalog.DURABLE_FILE_IO``). What it reaches
into: ``pyiceberg.io.pyarrow.PyArrowFileIO`` and ``PyArrowFile``, subclassed by :class:`DurableFileIO`
and ``_DurableFile``, overriding ``new_output`` and ``create``.
"""

from __future__ import annotations

import os
from typing import Any

from pyiceberg.io import OutputStream
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

from fanout_sink.durable_io import SyncingStream


class _DurableFile(PyArrowFile):
    def __init__(self, location: str, path: str, fs: Any, buffer_size: int) -> None:
        super().__init__(location=location, path=path, fs=fs, buffer_size=buffer_size)
        self.local_path = path

    def create(self, overwrite: bool = False) -> OutputStream:
        new_dirs = []
        directory = os.path.dirname(self.local_path)
        while directory and not os.path.exists(directory):
            new_dirs.append(directory)
            directory = os.path.dirname(directory)
        stream = super().create(overwrite=overwrite)
        return SyncingStream(stream, self.local_path, new_dirs)


class DurableFileIO(PyArrowFileIO):
    """``PyArrowFileIO`` whose local files are fsynced (with their directories) when closed: why, in
    :mod:`fanout_sink.durable_io`."""

    def new_output(self, location: str) -> PyArrowFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        if scheme != "file":
            return super().new_output(location)
        return _DurableFile(
            location=location,
            path=path,
            fs=self.fs_by_scheme(scheme, netloc),
            buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)),
        )
