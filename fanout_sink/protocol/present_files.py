"""Announced data files that no longer exist, left out of a table's commit with one ERROR naming them
(:mod:`fanout_sink.protocol.table_commit`): a snapshot naming a missing file fails every scan."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from pyiceberg.table import Table

from fanout_sink.protocol.commit_state import PendingFiles

log = logging.getLogger("fanout_sink.protocol.table_commit")


def present(table: Table, items: list[PendingFiles], reported: int) -> tuple[list[PendingFiles], int]:
    """``items`` without the data files that no longer exist, and how many those are; one ERROR names
    them, unless an earlier attempt of the round reported as many (``reported``).

    A snapshot that names a missing file fails every scan of the table. Workers rewrite files
    that waited too long for their transaction, but a paused process can still lose its files to
    orphan cleanup, or someone deletes them: those rows are lost, the table must stay readable.
    """
    paths = [r.file_path for p in items for r in p.event.files]
    if not paths:
        return items, 0
    if len(paths) == 1:  # a table fed by one task: no pool of threads started and joined for it
        exists = {paths[0]: table.io.new_input(paths[0]).exists()}
    else:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="file-check") as pool:
            exists = dict(
                zip(paths, pool.map(lambda path: table.io.new_input(path).exists(), paths), strict=True)
            )
    missing = [path for path, present in exists.items() if not present]
    if missing and reported != len(missing):  # once per round, not per attempt
        sources = sorted(
            {f"{p.event.topic}[{p.event.partition}] up to offset {p.event.next_offset}"
             for p in items if any(not exists[r.file_path] for r in p.event.files)}
        )  # fmt: skip
        log.error(
            "table %s: %d data file(s) announced on the control topic do not exist and are NOT "
            "appended, so that the table stays readable: %s. Their rows (from %s) are not in the "
            "table.\n  fix: find what deleted them (orphan cleanup with maintenance.orphan-older-than "
            "shorter than a stalled slice, or a manual delete) and deliver those records again.",
            ".".join(table.name()),
            len(missing),
            ", ".join(missing),
            "; ".join(sources),
            extra={"table": ".".join(table.name())},
        )
    if not missing:
        return items, 0
    kept = [
        replace(
            p,
            event=p.event.model_copy(
                update={"files": tuple(r for r in p.event.files if exists[r.file_path])}
            ),
        )
        for p in items
    ]
    return kept, len(missing)
