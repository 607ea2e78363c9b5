"""A wide sink's round costs what its fed tables cost, not what all its tables cost (issue 26 item 6).

Counted catalog calls, not wall time: a sink of many tables where only a few received data since the
last round asks the catalog about those few, in the coordinator and in the workers.
"""

from __future__ import annotations

from pathlib import Path

from fanout_sink.devtools.bench.wide_sink import NAMESPACE, WidePlan, WideSink

TABLES = 24
FED = {f"{NAMESPACE}.w00003", f"{NAMESPACE}.w00017"}


def test_a_round_asks_the_catalog_about_the_tables_that_received_data_only(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    wide = WideSink(WidePlan(tables=TABLES, partitions=TABLES, records=5), bootstrap_servers, tmp_path)
    try:
        everything = wide.round()  # every table fed: the workers' caches hold every table
        assert everything.tables_committed == TABLES
        few = wide.round(feed=FED)
    finally:
        wide.close()
    assert few.tables_committed == len(FED) and few.slices == len(FED)
    # Coordinator: per fed table one load for the floor and uuid, one commit (the SQL catalog's
    # commit loads the table once more itself); nothing for the 22 idle tables.
    assert few.coordinator_catalog_calls == {"commit_table": 2, "load_table": 4}, few
    # Workers: one load per table and slice, the re-check of the table's uuid before the
    # transaction; the cached tables are not reloaded, and the idle ones not touched.
    assert few.worker_catalog_calls == {"load_table": 2}, few
    # The control topic gains per fed slice its DataWritten and DataComplete, and the round's
    # StartCommit, CommitToTable per table and CommitComplete: nothing per idle table.
    assert few.control_messages == 2 * len(FED) + 1 + len(FED) + 1, few
    assert few.control_bytes < everything.control_bytes * len(FED) / TABLES * 2, (few, everything)
