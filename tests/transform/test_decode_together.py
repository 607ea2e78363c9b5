"""Small slices decoded together (issue 50): a step's small slices are read ahead and their JSON
values parsed in one Arrow call, each slice then taking its share; the output must be exactly what
each slice's own decode gives, and anything the shares cannot provably match is decoded alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.raw_slices import make_raw_slice
from transform.test_routed_output import pinned_processor, workload

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.protocol import slice_writer
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slice_writer import SliceInput, SliceWriter
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.transform.formats import json as json_format
from fanout_sink.transform.formats import json_together
from fanout_sink.transform.processor import RoutingProcessor

PIECE = 16
"""Records per small slice cut from the pinned workload's slices."""


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of records of every Arrow JSON parse, in order."""
    seen: list[int] = []
    real = json_format.arrow_read

    def counted(buffer: pa.Buffer, options: Any = None) -> pa.Table:
        table = real(buffer, options)
        seen.append(table.num_rows)
        return table

    monkeypatch.setattr(json_format, "arrow_read", counted)
    monkeypatch.setattr(json_together, "arrow_read", counted)
    yield seen


def _catalog_settings(folder: Path) -> CatalogSettings:
    folder.mkdir()
    return CatalogSettings(
        name="pinned", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder}"
    )


def _processor(folder: Path) -> RoutingProcessor:
    folder.mkdir()
    return pinned_processor(folder)[0]


def _output(out: Any) -> dict[str, Any]:
    return {
        "tables": {
            name: ([str(f) for f in rows.rows.schema], rows.rows.to_pylist())
            for name, rows in sorted(out.tables.items())
        },
        "dead_letters": [(d.key, d.value, d.headers) for d in out.dead_letters],
        "filtered": out.filtered,
    }


@pytest.mark.parametrize("mixed", [False, True], ids=["uniform", "mixed"])
def test_slices_decoded_together_give_exactly_what_each_gives_alone(
    tmp_path: Path, parses: list[int], mixed: bool
) -> None:
    """The pinned workload (new fields in later slices, nulls, nested values, dead letters of every
    stage, an int beyond int64, types that differ per table) cut into slices of 16 records, every
    four shown to the processor together first; each slice's output equals a second processor's,
    which decodes every slice alone. (Here most groups are decoded alone: a bad value, a new field, a
    type that widens; the next test counts the parses of a step that is parsed together.)"""
    pieces = []
    offset = 0
    for values in workload(mixed):
        for start in range(0, len(values), PIECE):
            pieces.append(make_raw_slice(values[start : start + PIECE], start_offset=offset + start))
        offset += len(values)
    alone, together = _processor(tmp_path / "alone"), _processor(tmp_path / "together")

    expected = [_output(alone(piece)) for piece in pieces]
    parses.clear()
    found = []
    for first in range(0, len(pieces), 4):
        together.prepare(pieces[first : first + 4])
        found += [_output(together(piece)) for piece in pieces[first : first + 4]]

    for n, (want, got) in enumerate(zip(expected, found, strict=True)):
        assert got == want, f"slice {n} decoded together differs from its own decode"
    if not mixed:
        assert max(parses) > PIECE, "some slices were parsed together"


def test_a_steps_small_one_table_slices_are_parsed_in_one_call_and_write_the_same_files(
    tmp_path: Path, parses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-out step: one small slice per table (a whole database's topics routed by a field). Each
    slice's parse cost a worker ~0.2 ms of fixed cost for ~30 records, a fifth of its CPU at 5,000
    tables (py-spy, issue 50). The step's slices are read ahead and parsed together; the files hold
    the same rows as when every slice is parsed alone."""
    tables = 12

    def step(folder: Path, offset: int) -> tuple[list[list[Any]], list[SliceInput]]:
        parts = []
        for t in range(tables):
            values = [
                json.dumps({"t": f"t{t}", "id": offset + i, "page": "/", "amount": 1.5 * i}).encode()
                for i in range(20)
            ]
            raw = make_raw_slice(values, topic="db", partition=t, start_offset=offset)
            planned = Slice("db", t, offset, offset + 20)
            parts.append(SliceInput(planned, raw, None, SliceResult(planned, None)))
        written = writers[folder].write(parts, processors[folder])
        rows = [
            pq.read_table(f.file_path.removeprefix("file://")).to_pylist()
            for event in sorted(written.events, key=lambda e: e.table.identifier)
            for f in event.files
        ]
        return rows, parts

    writers: dict[Path, SliceWriter] = {}
    processors: dict[Path, RoutingProcessor] = {}
    for name in ("alone", "together"):
        folder = tmp_path / name
        settings = _catalog_settings(folder)
        config = parse_config(
            {
                "name": f"wide-{name}",
                "kafka": {"bootstrap.servers": "localhost:1"},  # never contacted
                "source": {"topics": ["db"], "format": "json"},
                "catalog": settings.model_dump(),
                "dynamic": {"table": "join('.', ['wide', t])", "applies-to": "all", "auto-create": True},
            },
            "decoded together",
        )
        load_catalog(settings).create_namespace("wide")
        processors[folder] = RoutingProcessor(config, load_catalog(settings))
        writers[folder] = SliceWriter(SinkChannel.from_config(config, PartitionGroups()))
        writers[folder]._control_max_bytes = 1024 * 1024  # no broker is asked

    together = tmp_path / "together"
    step(together, 0)  # the first step: tables created, the fields learnt
    parses.clear()
    rows, parts = step(together, 20)
    assert len(parses) == 1, f"{len(parses)} Arrow parses for a step of {tables} slices"
    assert [p.result.rows for p in parts] == [{f"wide.t{t}": 20} for t in range(tables)]

    monkeypatch.setattr(slice_writer, "DECODED_TOGETHER", 0)  # every chunk processed as it comes
    alone = tmp_path / "alone"
    step(alone, 0)
    parses.clear()
    rows_alone, _ = step(alone, 20)
    assert len(parses) == tables
    assert rows == rows_alone
