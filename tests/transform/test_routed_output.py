"""The processor's whole output, pinned: every table's rows and schema and every dead letter of a
mixed-type and a uniform workload, compared with a stored copy (``routed_output.json``).

The decode/route/convert path is tuned for CPU (issue 48); a speed-up must not change a single
value, type, column order, table schema or dead-letter reason. The workloads hold what the fast
paths must get right: JSON types that differ per table and within one table, nulls, missing
fields, new fields in later slices (evolution), nested structs and lists of structs, records that
go to two tables, values that must be dead letters at decode (invalid JSON, no object, NaN, a null
value), route (no table) and convert (a string into a double column), integers beyond int64 and
tables created from their first records (static and dynamic). Several slices run through one
processor, so the decoder's remembered schemas are exercised as a worker's are.

After a deliberate change of the output, regenerate the copy and review its diff:

    PYTHONPATH=tests .venv/bin/python -m transform.test_routed_output
"""

from __future__ import annotations

import base64
import json
import random
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType
from support.raw_slices import make_raw_slice

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import parse_config
from fanout_sink.transform import deadletter
from fanout_sink.transform.processor import RoutingProcessor, build_processor

EXPECTED = Path(__file__).with_name("routed_output.json")
SLICES = 4
LEAF_LISTS = ("rows", "dead_letters", "schema")
"""Lists stored one item per line."""
PER_SLICE = 160


def _config(settings: CatalogSettings) -> Any:
    kinds = {f"shop.t{n}": {"when": f"kind == 't{n}'", "auto-create": True} for n in range(6)}
    kinds["shop.t4"]["select"] = "{id: id, amount: amount, tier: customer.tier, first_sku: items[0].sku}"
    return parse_config(
        {
            "name": "pinned",
            "source": {"topics": ["events"], "format": "json", "tombstones": "dead-letter"},
            "catalog": settings.model_dump(),
            "tables": {
                **kinds,
                "shop.priority": {"when": "priority == 'high'", "auto-create": True},
                "shop.fixed": {"when": "kind == 'fixed'"},
            },
            "dynamic": {"table": "join('.', ['dyn', kind])", "allow": r"^dyn\.d[0-9]$", "auto-create": True},
            "unmatched": {"action": "dead-letter"},
            "dead-letter": {"topic": "dlq"},
        },
        "pinned",
    )


def _record(rng: random.Random, n: int, mixed: bool, late: bool) -> Any:
    """One record; ``late`` (later slices) adds fields the first slices never carried."""
    kind = rng.choice(["t0", "t1", "t2", "t3", "t4", "t5", "fixed", "d1", "d2", "dX"])
    record: dict[str, Any] = {"id": n, "kind": kind}
    number = round(rng.uniform(-50, 500), 2)
    if kind in ("t0", "d1") and mixed:
        record["amount"] = f"{number:.2f}"  # string on these kinds, number on the others
    elif kind == "t2":
        record["amount"] = rng.choice([int(number) if mixed else number, None])
    else:
        record["amount"] = number
    if mixed and kind == "t1":
        record["ts"] = 1_714_521_600_000 + n  # epoch millis here, ISO text elsewhere
    elif rng.random() < 0.8:
        record["ts"] = f"2024-05-{1 + n % 28:02d}T{n % 24:02d}:00:00Z"
    if rng.random() < 0.7:
        record["customer"] = {"id": f"c{rng.randrange(100)}", "tier": rng.choice(["gold", "silver", None])}
    if rng.random() < 0.5:
        record["items"] = [{"sku": f"S{rng.randrange(9)}", "qty": rng.randrange(1, 4)}]
    if rng.random() < 0.2:
        record["priority"] = "high"
    if kind == "fixed" and rng.random() < 0.15:
        if mixed:
            record["amount"] = rng.choice(["abc", "12.5", True])  # "abc" and true cannot be a double
        else:
            del record["id"]  # a required column
    if late and rng.random() < 0.5:
        record["note"] = rng.choice(["a", "b", None])
    if mixed and kind == "t5" and rng.random() < 0.1:
        record["amount"] = "n/a"  # a type change inside one table's records
    if rng.random() < 0.05:
        del record["kind"]  # no route: unmatched
    return record


def _bad(rng: random.Random, n: int, mixed: bool) -> bytes | None:
    """A value that must be a dead letter; invalid JSON only in the mixed workload (Arrow's parser
    would refuse the uniform workload's batch, which is to be parsed in one call)."""
    return rng.choice(
        [
            None,
            b"{not json" if mixed else b"",
            b"[1, 2]",
            b'{"id": %d, "kind": "t1", "amount": NaN}' % n,
            b'{"id": %d, "kind": "t2", "note": "line\nbreak"}' % n,
            b"\xff\xfe",
        ]
    )


def workload(mixed: bool, seed: int = 5) -> list[list[bytes | None]]:
    rng = random.Random(seed)
    slices = []
    for s in range(SLICES):
        values: list[bytes | None] = []
        for i in range(PER_SLICE):
            n = s * PER_SLICE + i
            if s == SLICES - 1 and i == PER_SLICE // 2:
                # Beyond int64: Arrow would make the column double, so this slice is parsed per record.
                values.append(b'{"id": %d, "kind": "t3", "amount": 123456789012345678901234}' % n)
            elif rng.random() < 0.03:
                values.append(_bad(rng, n, mixed))
            else:
                record = _record(rng, n, mixed, late=s >= 2)
                values.append(json.dumps(record).encode())
        slices.append(values)
    return slices


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime | date | Decimal):
        return f"{type(value).__name__}:{value}"
    if isinstance(value, float):
        return repr(value)
    return value


def _table_output(rows: pa.Table) -> dict[str, Any]:
    return {"schema": [str(f) for f in rows.schema], "rows": _plain(rows.to_pylist())}


_LETTER_HEADERS = {
    deadletter.REASON, deadletter.STAGE, deadletter.SOURCE_OFFSET, deadletter.TABLE, deadletter.COLUMN
}  # fmt: skip


def pinned_processor(folder: Path) -> tuple[RoutingProcessor, Catalog]:
    """The pinned sink's processor over a fresh catalog in ``folder`` (its fixed table created)."""
    settings = CatalogSettings(
        name="pinned", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder}"
    )
    catalog = load_catalog(settings)
    catalog.create_namespace("shop")
    catalog.create_table(
        "shop.fixed",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "kind", StringType(), required=False),
            NestedField(3, "amount", DoubleType(), required=False),
        ),
    )
    return build_processor(_config(settings), catalog), catalog


def run(mixed: bool, folder: Path) -> list[dict[str, Any]]:
    """The processor's output for each slice of the workload, in plain JSON terms."""
    process, catalog = pinned_processor(folder)
    outputs = []
    offset = 0
    for values in workload(mixed):
        out = process(make_raw_slice(values, start_offset=offset))
        offset += len(values)
        assert process.last_stats.reconciles()
        letters = [
            {k[len(deadletter.PREFIX) :]: v.decode() for k, v in d.headers if k in _LETTER_HEADERS}
            for d in out.dead_letters
        ]
        outputs.append(
            {
                "tables": {name: _table_output(rows.rows) for name, rows in sorted(out.tables.items())},
                "dead_letters": letters,
                "filtered": out.filtered,
            }
        )
    outputs.append(
        {
            "schemas": {
                ".".join(t): str(catalog.load_table(t).schema())
                for t in sorted(catalog.list_tables("shop") + catalog.list_tables("dyn"))
            }
        }
    )
    return outputs


def _outputs(folder: Path) -> dict[str, Any]:
    return {kind: run(kind == "mixed", folder / kind) for kind in ("mixed", "uniform")}


def _dumps(outputs: dict[str, Any]) -> str:
    """One line per row, schema field or dead letter, so a regenerated copy's diff shows what changed."""

    def dump(value: Any, pad: str, key: str = "") -> str:
        if isinstance(value, dict) and value:
            items = [f"{pad} {json.dumps(k)}: {dump(v, pad + ' ', k)}" for k, v in sorted(value.items())]
        elif isinstance(value, list) and value:
            leaves = key in LEAF_LISTS
            items = [f"{pad} {compact(v) if leaves else dump(v, pad + ' ')}" for v in value]
        else:
            return compact(value)
        ends = "{}" if isinstance(value, dict) else "[]"
        return ends[0] + "\n" + ",\n".join(items) + f"\n{pad}{ends[1]}"

    def compact(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    return dump(outputs, "") + "\n"


def test_the_routed_tables_and_dead_letters_are_exactly_the_pinned_ones(tmp_path: Path) -> None:
    expected = json.loads(EXPECTED.read_text())
    found = _outputs(tmp_path)
    for kind in ("mixed", "uniform"):
        for n, (want, got) in enumerate(zip(expected[kind], found[kind], strict=True)):
            assert got == want, f"{kind} slice {n} differs from {EXPECTED.name}"


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        EXPECTED.write_text(_dumps(_outputs(Path(tmp))))


if __name__ == "__main__":
    main()
