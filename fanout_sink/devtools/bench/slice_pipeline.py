"""Decode + route + convert + write one partition slice; vectorised path versus per-record path.

    python -m fanout_sink.devtools.bench.slice_pipeline --records 100000 --out bench.md

The slice holds JSON orders, payments and clicks. Routing sends orders to two tables (one with a
projection and a day partition), payments to one, and clicks are dropped. The *vectorised* path
decodes the batch with ``pyarrow.json`` and evaluates predicates and projections with
``pyarrow.compute``; the *per-record* path parses each value with ``json.loads`` and evaluates
every expression through jmespath per record. Both convert with the same vectorised casts and
write each table's rows as Parquet with pyarrow (the step the worker performs). Tables are
created in a warm-up run so table creation is not timed. Throughput counts input records and
input value bytes; the best of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config import parse_config
from fanout_sink.devtools.raw_slices import make_raw_slice
from fanout_sink.transform.decode import JsonDecoder
from fanout_sink.transform.processor import RoutingProcessor


def _records(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.random()
        ts = f"2024-05-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z"
        if kind < 0.5:
            record: dict[str, Any] = {
                "type": "order",
                "id": i,
                "customer": {"id": f"c{rng.randrange(10_000)}", "tier": rng.choice(["gold", "silver"])},
                "amount": round(rng.uniform(1, 500), 2),
                "currency": "EUR",
                "ts": ts,
                "items": [{"sku": f"SKU-{rng.randrange(100)}", "qty": rng.randrange(1, 5)}],
            }
        elif kind < 0.8:
            record = {
                "type": "payment",
                "id": i,
                "method": rng.choice(["card", "iban"]),
                "amount": 12.5,
                "ts": ts,
            }
        else:
            record = {"type": "click", "id": i, "page": "/home", "ts": ts}
        out.append(json.dumps(record).encode())
    return out


def _config(settings: CatalogSettings) -> Any:
    return parse_config(
        {
            "name": "bench",
            "source": {"topics": ["shop"]},
            "catalog": settings.model_dump(),
            "tables": {
                "bench.orders": {
                    "when": "type == 'order'",
                    "select": "{id: id, customer: customer.id, tier: customer.tier, amount: amount, ts: ts}",
                    "partition-by": ["day(ts)"],
                },
                "bench.big_orders": {"when": "type == 'order' && amount > `250`"},
                "bench.payments": {"when": "type == 'payment' && contains(['card', 'iban'], method)"},
            },
        },
        "bench",
    )


@dataclass
class Result:
    path: str
    records: int
    megabytes: float
    process_seconds: float
    write_seconds: float

    @property
    def total(self) -> float:
        return self.process_seconds + self.write_seconds

    def row(self) -> str:
        return (
            f"| {self.path} | {self.records:,} | {self.process_seconds:.3f} | {self.write_seconds:.3f} | "
            f"{self.records / self.total:,.0f} | {self.megabytes / self.total:.1f} |"
        )


def _write(out: Any, folder: Path) -> None:
    for name, rows in out.tables.items():
        pq.write_table(rows.rows, folder / f"{name}.parquet")


def run(records: int, repeat: int, workdir: Path) -> list[Result]:
    values = _records(records)
    raw = make_raw_slice(values, topic="shop")
    megabytes = sum(len(v) for v in values) / 1e6
    results = []
    for path, vectorised in (("vectorised", True), ("per-record", False)):
        settings = CatalogSettings(
            name=f"bench_{path.replace('-', '_')}",
            type="sql",
            uri=f"sqlite:///{workdir / path / 'catalog.db'}",
            warehouse=f"file://{workdir / path / 'warehouse'}",
        )
        config = _config(settings)
        processor = RoutingProcessor(
            config,
            load_catalog(settings),
            vectorised=vectorised,
            decoder=JsonDecoder(per_record=not vectorised),
        )
        processor(make_raw_slice(values[:200], topic="shop"))  # creates the tables
        out_dir = workdir / path / "files"
        out_dir.mkdir(parents=True, exist_ok=True)
        best: Result | None = None
        for _ in range(repeat):
            start = time.perf_counter()
            out = processor(raw)
            middle = time.perf_counter()
            _write(out, out_dir)
            end = time.perf_counter()
            assert processor.last_stats.reconciles()
            result = Result(path, records, megabytes, middle - start, end - middle)
            if best is None or result.total < best.total:
                best = result
        assert best is not None
        results.append(best)
    return results


def table(results: list[Result]) -> str:
    lines = [
        "| path | records | decode+route+convert s | write s | records/s | MB/s |",
        "|---|---:|---:|---:|---:|---:|",
        *[r.row() for r in results],
    ]
    if len(results) == 2:
        speedup = results[1].total / results[0].total
        lines.append("")
        lines.append(f"vectorised is {speedup:.1f}x the per-record path (end to end, including the write).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000, help="records in the slice (default 100000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; the best is reported")
    parser.add_argument("--out", type=Path, help="write the results table (markdown) here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fanout-bench-") as tmp:
        results = run(args.records, args.repeat, Path(tmp))
    for r in results:
        print(
            f"{r.path:>10}: {r.records / r.total:>10,.0f} records/s  {r.megabytes / r.total:6.1f} MB/s  "
            f"(process {r.process_seconds:.3f}s, write {r.write_seconds:.3f}s, {r.records:,} records, "
            f"{r.megabytes:.1f} MB)"
        )
    text = table(results)
    if args.out is not None:
        command = f"python -m fanout_sink.devtools.bench.slice_pipeline --records {args.records}"
        args.out.write_text(f"# slice pipeline benchmark\n\n`{command}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
