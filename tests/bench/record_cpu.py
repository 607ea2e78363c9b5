"""CPU per record of the worker's processor, stage by stage, on the side-by-side benchmark's records.

    PYTHONPATH=tests .venv/bin/python -m bench.record_cpu --records 500000 --repeat 3
    PYTHONPATH=tests .venv/bin/python -m bench.record_cpu --variant mixed-50 --profile /tmp/mixed.prof

One process, no Kafka, no Spark: the processor a worker builds (``build_processor``) for the
benchmark's sink config (one ``when`` per table on the route field), fed the workload's values
(:mod:`bench.workload`) as raw slices of ``--chunk`` records, the chunk the worker's reader hands
the processor. The tables exist before the run (created as the side-by-side benchmark creates them)
and a warm-up chunk has loaded them, so only the per-record path is timed.

CPU is ``time.process_time`` (every thread of the process: Arrow parses large buffers on its pool),
per stage, by wrapping the processor's steps: ``decode`` (screen + Arrow's JSON parse of the chunk,
or of its routing fields), ``view`` (the records' Kafka metadata), ``route`` (the ``when`` rules),
``table records`` (each table's records taken from the chunk, or parsed per table when the chunk's
fields disagree on types), ``evolve`` (the schema check), ``convert`` (the cast to each table's
schema) and ``rest`` (what the processor does around them). The best of ``--repeat`` runs is taken
per variant (variants alternate, so a busy moment on a shared machine does not hit one only).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from support.raw_slices import make_raw_slice

from bench.workload import NAMESPACE, ROUTE_FIELD, Variant, create_tables, parse_variant, value_chunks
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.transform import processor as processor_module
from fanout_sink.transform.formats.decoded import Decoded
from fanout_sink.transform.processor import RoutingProcessor, build_processor
from fanout_sink.transform.record_view import RecordView

STAGES = ("decode", "view", "route", "table records", "evolve", "convert", "rest")


def sink_config(variant: Variant, settings: CatalogSettings) -> Any:
    """The side-by-side benchmark's sink config (``bench.ours.sink_config``) without its Kafka parts."""
    tables = {
        name: {"when": f"{ROUTE_FIELD} == '{name.rsplit('.', 1)[1]}'"} for name in variant.table_names()
    }
    return parse_config(
        {
            "name": "record-cpu",
            "source": {"topics": ["bench"], "format": "json"},
            "catalog": settings.model_dump(),
            "tables": tables,
        },
        "record-cpu",
    )


@dataclass
class Stages:
    """CPU seconds per stage of one run."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    total: float = 0.0

    def per_record_us(self, records: int) -> dict[str, float]:
        inner = sum(v for k, v in self.seconds.items() if k != "rest")
        shares = {**self.seconds, "rest": self.total - inner}
        return {k: v / records * 1e6 for k, v in shares.items()}


class _Timer:
    """Charges the CPU of the wrapped calls to their stage (the outermost wrapped call only)."""

    def __init__(self) -> None:
        self.stages = Stages()
        self._depth = 0

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stages.seconds[stage] += time.process_time() - start
                self._depth -= 1

        return timed


@contextmanager
def _instrumented(processor: RoutingProcessor, timer: _Timer) -> Iterator[None]:
    """The processor's stages wrapped by ``timer`` while inside."""
    originals = (processor.decoder, processor.router.route, RecordView.__dict__["build"], RecordView.subset)
    originals_module = (processor_module.convert, processor.tables.evolve)  # type: ignore[attr-defined]
    expect = getattr(Decoded, "expect", None)  # None: a checkout from before it (a baseline)
    if expect is not None:
        Decoded.expect = timer.wrap("table records", expect)  # type: ignore[method-assign]
    processor.decoder = timer.wrap("decode", processor.decoder)
    processor.router.route = timer.wrap("route", processor.router.route)  # type: ignore[method-assign]
    build = RecordView.build
    RecordView.build = classmethod(timer.wrap("view", lambda cls, *a: build(*a)))  # type: ignore[assignment,method-assign]
    RecordView.subset = timer.wrap("table records", originals[3])  # type: ignore[method-assign]
    processor_module.convert = timer.wrap("convert", originals_module[0])  # type: ignore[attr-defined]
    processor.tables.evolve = timer.wrap("evolve", originals_module[1])  # type: ignore[method-assign]
    try:
        yield
    finally:
        if expect is not None:
            Decoded.expect = expect  # type: ignore[method-assign]
        processor.decoder = originals[0]
        processor.router.route = originals[1]  # type: ignore[method-assign]
        RecordView.build = originals[2]  # type: ignore[method-assign]
        RecordView.subset = originals[3]  # type: ignore[method-assign]
        processor_module.convert = originals_module[0]  # type: ignore[attr-defined]
        processor.tables.evolve = originals_module[1]  # type: ignore[method-assign]


def prepare(
    variant: Variant, records: int, chunk: int, folder: Path
) -> tuple[RoutingProcessor, list[pa.Table]]:
    """The processor (its tables created and loaded) and the variant's raw slices."""
    settings = CatalogSettings(
        name=f"bench_{variant.kind}", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder}"
    )
    catalog = load_catalog(settings)
    create_tables(catalog, variant)
    processor = build_processor(sink_config(variant, settings), catalog)
    slices = []
    offset = 0
    for values in value_chunks(variant, records, chunk=chunk):
        slices.append(make_raw_slice(values, topic=NAMESPACE, start_offset=offset))
        offset += len(values)
    processor(slices[0])  # warm-up: every table loaded, the decoder's schemas known
    return processor, slices


def run_once(processor: RoutingProcessor, slices: list[pa.Table]) -> Stages:
    timer = _Timer()
    with _instrumented(processor, timer):
        start = time.process_time()
        for raw in slices:
            out = processor(raw)
            assert processor.last_stats.reconciles() and not out.dead_letters
        timer.stages.total = time.process_time() - start
    return timer.stages


def table(best: dict[str, Stages], records: int) -> str:
    names = list(best)
    rates = {name: best[name].per_record_us(records) for name in names}
    header = ["| stage | " + " | ".join(f"{n} µs/record" for n in names) + " |"]
    header.append("|---|" + "---:|" * len(names))
    rows = [f"| {stage} | " + " | ".join(f"{rates[n][stage]:.2f}" for n in names) + " |" for stage in STAGES]
    totals = [best[n].total / records * 1e6 for n in names]
    rows.append("| **total** | " + " | ".join(f"**{t:.2f}**" for t in totals) + " |")
    lines = header + rows
    uniform = [n for n in names if n.startswith("uniform")]
    mixed = [n for n in names if n.startswith("mixed")]
    if uniform and mixed:
        u, m = best[uniform[0]].total, best[mixed[0]].total
        lines += ["", f"{mixed[0]} costs {m / u:.2f}x {uniform[0]}'s CPU per record (rate {u / m:.0%})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", help="uniform-50, mixed-50, ... (repeatable)")
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--chunk", type=int, default=50_000, help="records per raw slice (default 50000)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--profile", type=Path, help="cProfile one more run of each variant into PATH[.variant]"
    )
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in (args.variant or ["uniform-50", "mixed-50"])]
    with tempfile.TemporaryDirectory(prefix="record-cpu-") as tmp:
        prepared = {v.name: prepare(v, args.records, args.chunk, Path(tmp) / v.name) for v in variants}
        gc.collect()
        gc.freeze()  # as the worker does once its state is built (spark/task.py)
        best: dict[str, Stages] = {}
        for _ in range(args.repeat):
            for name, (processor, slices) in prepared.items():
                stages = run_once(processor, slices)
                if name not in best or stages.total < best[name].total:
                    best[name] = stages
        if args.profile is not None:
            for name, (processor, slices) in prepared.items():
                profile = cProfile.Profile(time.process_time)  # CPU, not wall: the machine is shared
                profile.runcall(run_once, processor, slices)
                profile.dump_stats(f"{args.profile}.{name}")
    print(table(best, args.records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
