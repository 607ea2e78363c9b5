"""The sink's log formats: JSON lines an aggregator parses, plain lines a person reads; one handler."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout_sink import logs


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The sink's handler, writing into a buffer; restored afterwards."""
    logger = logging.getLogger(logs.ROOT)
    saved = (logger.level, list(logger.handlers), logger.propagate)
    logger.handlers = []
    buffer = io.StringIO()
    try:
        yield buffer
    finally:
        logger.handlers = saved[1]
        logger.setLevel(saved[0])
        logger.propagate = saved[2]


def _point_at(buffer: io.StringIO) -> None:
    handler = next(h for h in logging.getLogger(logs.ROOT).handlers if h.get_name() == "fanout-sink")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buffer)


def test_json_format_writes_one_object_per_line_with_the_structured_fields(
    captured: io.StringIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.TRACEBACKS_ENV, str(tmp_path))
    logs.configure("json", "DEBUG")
    _point_at(captured)
    log = logging.getLogger("fanout_sink.app")
    log.info("batch %d: %d records in", 7, 300, extra={"batch": 7, "topic": "orders", "partition": 2})
    log.debug("detail", extra={"batch": 7, logs.TRACEBACK: "Traceback ...\nBoom: x"})
    log.warning("attempt failed", extra={"batch": 7, "attempt": 1, logs.TRACEBACK: "Traceback ...\nBoom: x"})
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        log.exception("commit of %s failed", "shop.orders", extra={"table": "shop.orders", "offset": 41})
    lines = captured.getvalue().splitlines()
    assert len(lines) == 4, "one line per record, multi-line text included"
    first, debug, second, third = (json.loads(line) for line in lines)
    assert first["message"] == "batch 7: 300 records in"
    assert {key: first[key] for key in ("level", "logger", "batch", "topic", "partition")} == {
        "level": "INFO",
        "logger": "fanout_sink.app",
        "batch": 7,
        "topic": "orders",
        "partition": 2,
    }
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert "traceback" not in first and "attempt" not in first
    assert debug["traceback"] == "Traceback ...\nBoom: x", "at DEBUG the traceback stays in its field"
    # Above DEBUG: one line naming the file that holds the traceback.
    assert second["attempt"] == 1 and "traceback" not in second
    message, named = second["message"].split("; traceback in ")
    assert message == "attempt failed" and Path(named).read_text() == "Traceback ...\nBoom: x\n"
    assert third["level"] == "ERROR" and third["table"] == "shop.orders" and third["offset"] == 41
    assert "traceback" not in third and third["message"].startswith(
        "commit of shop.orders failed: ValueError: bad; traceback in "
    )
    kept = Path(third["message"].split("; traceback in ")[1]).read_text()
    assert kept.startswith("Traceback") and kept.endswith("ValueError: bad\nvalue\n")


def test_plain_format_names_the_traceback_file_and_puts_a_debug_traceback_under_its_line(
    captured: io.StringIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.TRACEBACKS_ENV, str(tmp_path))
    logs.configure("plain", "DEBUG")
    _point_at(captured)
    trace = "Traceback (most recent call last):\nBoom: x\n"
    logging.getLogger("fanout_sink.app").warning("batch 3 failed", extra={"batch": 3, logs.TRACEBACK: trace})
    logging.getLogger("fanout_sink.app").debug("batch 3 detail", extra={"batch": 3, logs.TRACEBACK: trace})
    lines = captured.getvalue().splitlines()
    assert " WARNING fanout_sink.app: batch 3 failed; traceback in " in lines[0]
    assert Path(lines[0].split("; traceback in ")[1]).read_text() == trace
    assert lines[1].endswith(" DEBUG fanout_sink.app: batch 3 detail")
    assert lines[2:] == ["Traceback (most recent call last):", "Boom: x"]


def test_configure_again_switches_the_format_on_the_same_handler(captured: io.StringIO) -> None:
    logs.configure("plain", "INFO")
    logs.configure("json", "WARNING")
    logger = logging.getLogger(logs.ROOT)
    ours = [h for h in logger.handlers if h.get_name() == "fanout-sink"]
    assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
    assert logger.level == logging.WARNING and not logger.propagate


def test_the_final_round_is_one_line_in_words_not_the_results_repr() -> None:
    from fanout_sink.protocol.coordinator import RoundResult
    from fanout_sink.protocol.table_commit import TableCommit
    from fanout_sink.spark.app import final_round_words

    tables = {
        f"shop.t{i}": TableCommit(f"shop.t{i}", "committed", table_uuid="u" * 36, snapshot_id=i, files=2)
        for i in range(12)
    }
    tables["shop.gone"] = TableCommit("shop.gone", "failed", error="CommitFailedException: " + "x" * 300)
    line = final_round_words(RoundResult("c-1", 10, 10, 1_700_000_000_000, tables, "stop"))
    assert line == "final commit round c-1: 13 table(s), 12 committed, 1 failed, 24 file(s)"
    assert final_round_words(RoundResult("c-2", 10, 10, None)) == "final commit round: nothing was pending"


def test_a_batch_is_one_line_in_words_naming_at_most_ten_tables() -> None:
    from fanout_sink.protocol.slices import Slice, SliceResult
    from fanout_sink.spark.batch import TABLES_NAMED, BatchSummary
    from fanout_sink.spark.task import SliceReport

    def report(partition: int, rows: dict[str, int], deleted: dict[str, int] | None = None) -> SliceReport:
        result = SliceResult(
            Slice("orders", partition, 0, 10),
            None,
            records_in=sum(rows.values()) + 1,
            rows=rows,
            files=dict.fromkeys(rows, 1),
            deleted_keys=deleted or {},
            filtered=1,
        )
        return SliceReport(result, 120 + partition)

    two = BatchSummary(
        [report(0, {"shop.orders": 3}), report(1, {"shop.orders": 2, "crm.c": 4}, {"crm.c": 1})]
    )
    assert two.describe(7, 2.0) == (
        "batch 7: 11 records in, 0 already delivered, 0 dead-lettered, 2 filtered; 9 rows in 3 files to "
        "2 table(s) (shop.orders: 5 rows, 2 files; crm.c: 4 rows, 1 files, 1 keys deleted) "
        "(2.0s, 2 slices, peak worker RSS 121 MB), 6 records/s"
    )
    wide = BatchSummary([report(0, {f"t.table_{i:03d}": 1000 + i for i in range(500)})])
    line = wide.describe(8, 1.0)
    assert "{" not in line and len(line) < 600, line
    assert f"t.table_{499:03d}: 1499 rows" in line and f"; {500 - TABLES_NAMED} more tables)" in line
    assert BatchSummary([]).describe(9, 0.1).startswith("batch 9: 0 records in, 0 already delivered, 0 dead")


def test_a_round_is_one_line_in_words_with_the_tables_not_committed_first() -> None:
    from fanout_sink.protocol.round_words import TABLES_NAMED, round_line
    from fanout_sink.protocol.table_commit import TableCommit

    tables = {"shop.orders": TableCommit("shop.orders", "committed", files=2)}
    tables["shop.gone"] = TableCommit("shop.gone", "failed", error="CommitFailedException: " + "x" * 500)
    assert round_line("c-1", "interval", tables, 1_796_647_212_871) == (
        "commit c-1 (interval): 2 table(s) 1 committed, 1 failed, 2 files "
        "(shop.gone failed (0 files), shop.orders committed (2 files)); vtts 2026-12-07T12:40:12.871Z"
    )
    wide = {f"t.{i:03d}": TableCommit(f"t.{i:03d}", "committed", files=1) for i in range(300)}
    line = round_line("c-2", "stop", wide, None)
    assert len(line) < 500 and line.endswith(f", {300 - TABLES_NAMED} more); no vtts"), line


def test_a_kept_traceback_is_a_file_the_line_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.TRACEBACKS_ENV, str(tmp_path / "tracebacks"))
    words = logs.keep_traceback("s-batch-3-attempt-1", "Traceback (most recent call last):\nBoom: x\n")
    assert words.startswith(f"; traceback in {tmp_path / 'tracebacks'}/") and words.endswith(".txt")
    assert (
        Path(words.removeprefix("; traceback in ")).read_text()
        == "Traceback (most recent call last):\nBoom: x\n"
    )
    assert logs.keep_traceback("s-batch-4-attempt-1", None) == ""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(logs.TRACEBACKS_ENV, str(tmp_path / "file" / "sub"))  # cannot be made
    assert logs.keep_traceback("s-batch-5-attempt-1", "Traceback") == ""
    monkeypatch.setenv(logs.TRACEBACKS_ENV, str(tmp_path / "few"))
    monkeypatch.setattr(logs, "TRACEBACKS_KEPT", 2)
    for attempt in range(3):
        logs.keep_traceback(f"s-batch-6-attempt-{attempt}", "Traceback")
    assert [p.name.split("-", 1)[1] for p in sorted((tmp_path / "few").iterdir())] == [
        f"s-batch-6-attempt-{attempt}-{os.getpid()}.txt" for attempt in (1, 2)
    ], "the newest kept"
