"""Refused data files kept where no cleanup takes them: files for a table that is gone, or that do not
fit its recreated successor (:mod:`fanout_sink.protocol.table_commit`), copied beside the table's
folder, outside every table location, before the round settles them."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from pyiceberg.io import FileIO

from fanout_sink.errors import TableError

QUARANTINE_FOLDER = "_fanout_sink_quarantine"
COPY_CHUNK_BYTES = 8 * 1024 * 1024
"""A refused file is copied to quarantine in chunks of this size: the driver never holds it whole."""


def quarantined(io: FileIO, paths: list[str], sink: str) -> str:
    """The refused files copied where cleanup cannot take them; how the ERROR says where they are."""
    try:
        copies = quarantine(io, paths, sink)
    except OSError as exc:
        # Settling the table would let the low watermark pass the files and orphan cleanup take
        # the only copy: the table's round fails instead, its files stay pending and are retried.
        raise TableError(
            f"copying {len(paths)} refused file(s) to the quarantine folder failed ({exc}); they stay "
            f"pending and the table's round is retried: {', '.join(paths)}.\n  fix: make "
            f"{quarantine_path(paths[0], sink).rpartition('/')[0]} writable"
        ) from exc
    return f"copied to {', '.join(copies)} (outside every table location: no cleanup removes them)"


def quarantine_path(path: str, sink: str) -> str:
    """Where a refused data file is kept: beside its table's folder, outside every table location,
    so that no orphan cleanup (the sink's or Iceberg's, which list a table's location) can take it.

    ``<ns folder>/<table>/data/<name>`` -> ``<ns folder>/_fanout_sink_quarantine/<sink>/<table>/<name>``
    """
    head, found, name = path.rpartition("/data/")
    if not found:
        head, _, name = path.rpartition("/")
    folder, _, table = head.rpartition("/")
    return f"{folder}/{QUARANTINE_FOLDER}/{sink}/{table}/{name}"


def quarantine(io: FileIO, paths: Sequence[str], sink: str) -> list[str]:
    """Copy refused data files to their quarantine paths (idempotent: a copy already there is kept,
    so a coordinator that crashed halfway repeats it safely); the copies' paths. The originals are
    left to orphan cleanup."""
    copies = []
    for path in paths:
        target = quarantine_path(path, sink)
        if not io.new_input(target).exists():
            with io.new_input(path).open() as source, io.new_output(target).create(overwrite=True) as stream:
                shutil.copyfileobj(source, stream, COPY_CHUNK_BYTES)  # never a whole file in memory
        copies.append(target)
    return copies
