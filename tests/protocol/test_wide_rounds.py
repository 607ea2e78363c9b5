"""A wide sink's round costs what its fed tables cost, not what all its tables cost (issue 26 item 6).

Counted catalog calls, not wall time: a sink of many tables where only a few received data since the
last round asks the catalog about those few, in the coordinator and in the workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyiceberg.table
import pytest
from bench.wide_sink import NAMESPACE, WidePlan, WideSink
from pyiceberg.io import InputFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata

from fanout_sink.protocol import slice_writer
from fanout_sink.pyiceberg_internals import sql_catalog, transactions

TABLES = 24
FED = {f"{NAMESPACE}.w00003", f"{NAMESPACE}.w00017"}


def test_a_round_asks_the_catalog_about_the_tables_that_received_data_only(
    bootstrap_servers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []

    def counted(tables: dict[str, pyiceberg.table.Table]) -> dict[str, str | None]:
        checked.extend(tables)
        return sql_catalog.current_table_uuids(tables)

    wide = WideSink(WidePlan(tables=TABLES, partitions=TABLES, records=5), bootstrap_servers, tmp_path)
    try:
        everything = wide.round()  # every table fed: the workers' caches hold every table
        assert everything.tables_committed == TABLES
        monkeypatch.setattr(slice_writer, "current_table_uuids", counted)
        few = wide.round(feed=FED)
    finally:
        wide.close()
    assert few.tables_committed == len(FED) and few.slices == len(FED)
    # Coordinator: per fed table one commit; its metadata (for the floor and uuid, and the commit's
    # base: the SQL catalog's commit does not load it again) read from the pointer the round's one
    # query found, not through load_table; nothing for the 22 idle tables.
    assert few.coordinator_catalog_calls == {"commit_table": 2}, few
    # Workers: no load; the re-check of each fed table's uuid before the transaction reads the SQL
    # catalog's pointers (one query per slice here); the idle tables are not touched.
    assert few.worker_catalog_calls == {}, few
    assert sorted(checked) == sorted(FED), checked
    # The control topic gains per fed slice its DataWritten and DataComplete, and the round's
    # StartCommit, CommitToTable per table and CommitComplete: nothing per idle table.
    assert few.control_messages == 2 * len(FED) + 1 + len(FED) + 1, few
    assert few.control_bytes < everything.control_bytes * len(FED) / TABLES * 2, (few, everything)


def test_a_table_commit_applies_its_staged_updates_once_per_change(
    bootstrap_servers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyIceberg's transaction re-applied its staged updates (a deep copy of the whole table metadata)
    on every look at its metadata: ~19 times per append, the largest CPU cost of a wide sink's round."""
    applied: list[int] = []

    def counting(own: Callable[..., TableMetadata]) -> Callable[..., TableMetadata]:
        def apply(base: TableMetadata, updates: tuple[Any, ...], *args: Any, **kwargs: Any) -> TableMetadata:
            applied.append(len(updates))
            return own(base, updates, *args, **kwargs)

        return apply

    for module in (pyiceberg.table, transactions):  # PyIceberg's own transaction, and ours
        if hasattr(module, "update_table_metadata"):
            monkeypatch.setattr(module, "update_table_metadata", counting(module.update_table_metadata))
    wide = WideSink(WidePlan(tables=3, partitions=3, records=5), bootstrap_servers, tmp_path)
    try:
        wide.round()
        applied.clear()
        assert wide.round().tables_committed == 3
    finally:
        wide.close()
    # Per table: the append's snapshot and ref, then the properties: one application per stage.
    assert len(applied) <= 3 * 3, applied


def test_a_table_commit_reads_the_table_metadata_once(
    bootstrap_servers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The floor check and the commit share one load of the table: the SQL catalog's commit loaded
    the table a second time (its metadata JSON read and parsed again), ~a fifth of a table commit's
    CPU (issue 32, docs/benchmarks/wide-sinks.md)."""
    reads: list[str] = []
    counting = False
    own_read = FromInputFile.table_metadata

    def read(input_file: InputFile, *args: Any, **kwargs: Any) -> TableMetadata:
        if counting:
            reads.append(input_file.location.split("/metadata/")[0].rsplit("/", 1)[-1])
        return own_read(input_file, *args, **kwargs)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(read))
    wide = WideSink(WidePlan(tables=3, partitions=3, records=5), bootstrap_servers, tmp_path)
    own_round = wide.coordinator.commit_round

    def counted_round(*args: Any, **kwargs: Any) -> Any:  # the workers' own loads are not counted
        nonlocal counting
        counting = True
        try:
            return own_round(*args, **kwargs)
        finally:
            counting = False

    monkeypatch.setattr(wide.coordinator, "commit_round", counted_round)
    try:
        wide.round()  # the first commit of each table
        reads.clear()
        assert wide.round().tables_committed == 3
    finally:
        wide.close()
    assert sorted(reads) == sorted(name.split(".")[-1] for name in wide.plan.table_names()), reads
