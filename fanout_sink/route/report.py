"""A :class:`~fanout_sink.route.preview.Preview` as text (per table, then per record) or JSON."""

from __future__ import annotations

import json
from typing import Any

from fanout_sink.route.preview import Preview, RecordLine, TableLine
from fanout_sink.transform.trace import Outcome

ROW_TEXT_LIMIT = 160
"""A row shown on a record's line is cut to this many characters (``--format json`` has it whole)."""


def _row_text(row: dict[str, Any]) -> str:
    text = json.dumps(row, default=str, ensure_ascii=False)
    return text if len(text) <= ROW_TEXT_LIMIT else text[: ROW_TEXT_LIMIT - 3] + "..."


def _outcome_text(outcome: Outcome, record: RecordLine, dead_letter_topic: str | None) -> str:
    if outcome.kind == "row":
        assert outcome.table is not None
        row = record.rows.get(outcome.table)
        return f"-> {outcome.table}" + (f" {_row_text(row)}" if row is not None else "")
    if outcome.kind == "delete":
        return f"-> {outcome.table}: deletes its key"
    if outcome.kind == "superseded":
        return f"-> {outcome.table}: superseded ({outcome.reason})"
    if outcome.kind == "filtered":
        return f"filtered: {outcome.reason}"
    where = ", ".join(
        part
        for part in (
            outcome.stage,
            outcome.table and f"table {outcome.table}",
            outcome.column and f"column {outcome.column}",
        )
        if part
    )
    if record.stops and not outcome.policy:
        return f"STOPS THE SINK ({where}; errors.tolerance is none): {outcome.reason}"
    return f"dead letter to {dead_letter_topic} ({where}): {outcome.reason}"


def _table_text(line: TableLine) -> list[str]:
    state = "would be created" if line.created else "exists"
    if line.changes and not line.created:
        state += f"; would evolve: {'; '.join(line.changes)}"
    counts = f"{line.rows} row(s)"
    if line.deletes:
        counts += f", {line.deletes} deleted key(s)"
    if line.dead_letters:
        counts += f", {line.dead_letters} dead letter(s)"
    out = [f"table {line.name} ({state}): {counts}"]
    for name, kind, required in line.columns:
        mark = "+" if name in line.added and not line.created else " "
        out.append(f"  {mark} {name}: {kind}{' (required)' if required else ''}")
    return out


def render_text(preview: Preview) -> str:
    """Notes, one block per table, the counts, then one line per record."""
    lines = [f"note: {note}" for note in preview.notes]
    for table in preview.tables.values():
        lines += _table_text(table)
    kinds = [o.kind for r in preview.records for o in r.outcomes]
    lines.append(
        f"{len(preview.records)} record(s): {kinds.count('row')} row(s), {kinds.count('delete')} delete(s), "
        f"{kinds.count('superseded')} superseded, {kinds.count('dead-letter')} dead letter(s), "
        f"{kinds.count('filtered')} filtered; nothing was written"
    )
    if preview.stops:
        first = preview.stops[0]
        lines.append(
            f"a run would stop at {first.topic}[{first.partition}]@{first.offset} (errors.tolerance is none; "
            f"{len(preview.stops)} record(s) would stop it): fix the records or set a dead-letter topic"
        )
    for record in preview.records:
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        texts = [_outcome_text(o, record, preview.dead_letter_topic) for o in record.outcomes]
        for text in texts or ["no outcome"]:
            lines.append(f"{where} {text}")
    return "\n".join(lines)


def _outcome_json(outcome: Outcome, record: RecordLine) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": outcome.kind}
    for key in ("table", "reason", "stage", "column"):
        if getattr(outcome, key) is not None:
            out[key] = getattr(outcome, key)
    if outcome.kind == "dead-letter":
        out["policy"] = outcome.policy
    if outcome.kind == "row" and outcome.table in record.rows:
        out["row"] = json.loads(json.dumps(record.rows[outcome.table], default=str))
    return out


def as_json(preview: Preview) -> dict[str, Any]:
    """The preview as JSON-ready data: ``tables``, ``records``, ``stops``, ``notes``."""
    return {
        "notes": preview.notes,
        "errors.tolerance": preview.tolerance,
        "dead-letter.topic": preview.dead_letter_topic,
        "tables": [
            {
                "name": t.name,
                "created": t.created,
                "columns": [{"name": n, "type": k, "required": r} for n, k, r in t.columns],
                "added": t.added,
                "changes": t.changes,
                "rows": t.rows,
                "deletes": t.deletes,
                "dead_letters": t.dead_letters,
            }
            for t in preview.tables.values()
        ],
        "records": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "stops": r.stops,
                "outcomes": [_outcome_json(o, r) for o in r.outcomes],
            }
            for r in preview.records
        ],
    }
