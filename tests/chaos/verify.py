"""The verdict of a chaos run: every table row by row against what the source topics hold.

Ground truth is the source topics themselves (read to their end), not the producer's bookkeeping:
each record's expected tables follow from its value (``scenario.expected_tables``), so the check
needs no trust in anything that was killed during the run.

A change table is checked key by key against the change stream's model (missing, extra, wrong-value
and duplicate keys, each counted), after the change topic was read to its end and found to hold the
stream exactly: every message, each key's in the stream's order and in one partition. Only then does
the model say what the table must hold.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.change_state import check_state
from confluent_kafka import Message

from chaos import changes, scenario
from chaos.changes import ChangeTraffic
from chaos.maintenance import ASIDE_INFIX
from fanout_sink.devtools.topics import header_pairs, read_to_end
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.offsets import source_positions
from fanout_sink.protocol import table_state
from fanout_sink.protocol.channel import sink_group

Coordinates = tuple[str, int, int]
_ASIDE = re.compile(rf"(?P<base>.+){re.escape(ASIDE_INFIX)}(?P<serial>\d+)")


@dataclass
class SourceTruth:
    """What the sink was given: expected id multisets per table, bad records, filtered records."""

    records: int = 0
    tables: dict[str, Counter[str]] = field(default_factory=dict)
    bad: Counter[Coordinates] = field(default_factory=Counter)
    filtered: set[str] = field(default_factory=set)


@dataclass
class Verdict:
    records: int = 0
    rows: int = 0
    dead_lettered: int = 0
    filtered: int = 0
    duplicates: int = 0
    losses: int = 0
    snapshots: int = 0
    changes: int = 0
    """Change-topic messages (events and tombstones); the counts below are of the change table's keys."""
    change_keys: int = 0
    """Keys the model holds: what the change table must hold, one row each."""
    change_rows: int = 0
    change_missing: int = 0
    change_extra: int = 0
    change_wrong: int = 0
    """Keys in both whose row differs from the model's in some column."""
    change_duplicate_keys: int = 0
    tables: dict[str, Counter[str]] = field(default_factory=dict)
    """Each append table's ids as the source topics route them: what the table was checked against,
    for a caller that reads the same tables another way."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def source_truth(bootstrap: str, topics: list[str], retired: Sequence[Message] = ()) -> SourceTruth:
    """What the topics hold now, and the ``retired`` records of their generations deleted earlier
    (``topic-recreate``): a recreated topic's offsets start over, so two generations' bad records may
    share coordinates, and each must be dead-lettered once (a multiset)."""
    truth = SourceTruth()
    for message in [*retired, *read_to_end(bootstrap, topics)]:
        truth.records += 1
        rid = (message.key() or b"").decode()
        tables = scenario.expected_tables(message.value() or b"")
        if tables is None:
            truth.bad[(message.topic() or "", message.partition() or 0, message.offset() or 0)] += 1
        elif not tables:
            truth.filtered.add(rid)
        for table in tables or ():
            truth.tables.setdefault(table, Counter())[rid] += 1
    return truth


def dead_letter_coordinates(bootstrap: str, topic: str) -> Counter[Coordinates]:
    """Source coordinates of every dead letter, from the headers the sink sets."""
    found: Counter[Coordinates] = Counter()
    for message in read_to_end(bootstrap, [topic]):
        headers = {k: v.decode() for k, v in header_pairs(message)}
        found[
            (
                headers["fanout-sink.source.topic"],
                int(headers["fanout-sink.source.partition"]),
                int(headers["fanout-sink.source.offset"]),
            )
        ] += 1
    return found


def control_offset_regressions(table: Any, sink: str) -> tuple[int, list[str]]:
    """Snapshots of ``sink`` in the table's ancestry, and every place its control offsets went back."""
    from pyiceberg.table.snapshots import ancestors_of

    offsets_key = table_state.key(sink, "control-offsets")
    # Summary.get, never ``in``: pyiceberg's Summary has no __contains__, and ``in`` is always true.
    ancestry = ancestors_of(table.current_snapshot(), table.metadata)
    texts = [s.summary.get(offsets_key) for s in ancestry if s.summary is not None]
    history = [{int(p): int(o) for p, o in json.loads(t).items()} for t in reversed(texts) if t is not None]
    regressions = [
        f"control offsets went back from {before} to {after}"
        for before, after in itertools.pairwise(history)
        if any(after.get(p, -1) < o for p, o in before.items())
    ]
    return len(history), regressions


def verify(
    bootstrap: str,
    topics: list[str],
    dead_letter_topic: str,
    sink: str,
    catalog: Any,
    change_traffic: ChangeTraffic | None = None,
    retired: Sequence[Message] = (),
) -> Verdict:
    """``topics`` are the append traffic's; ``change_traffic`` the change stream, when the run had one;
    ``retired`` the records of source topics deleted (and recreated) during the run."""
    truth = source_truth(bootstrap, topics, retired)
    verdict = Verdict(records=truth.records, tables=truth.tables)
    problems = verdict.problems
    change_topics = [change_traffic.topic] if change_traffic is not None else []
    # First, while the last commits are fresh: a broker with a short offset retention forgets them.
    for position in source_positions(
        KafkaClientFactory({"bootstrap.servers": bootstrap}), sink_group(sink), topics + change_topics
    ):
        if position.committed != position.end:
            problems.append(
                f"sink group at {position.committed} for {position.topic}[{position.partition}], "
                f"the topic ends at {position.end}"
            )

    landed: set[str] = set()
    existing = {".".join(t) for ns in scenario.NAMESPACES for t in _list_tables(catalog, ns)}
    generations = table_generations(existing)
    if change_traffic is not None:
        _verify_changes(bootstrap, change_traffic, generations.pop(changes.TABLE, []), sink, catalog, verdict)
    for name in sorted(set(generations) - set(truth.tables)):
        problems.append(f"{name}: a table no record should have created")
    for name, expected in sorted(truth.tables.items()):
        if name not in generations:
            problems.append(f"{name}: missing, {sum(expected.values())} rows expected")
            verdict.losses += sum(expected.values())
            continue
        got: Counter[str] = Counter()
        for generation in generations[name]:
            table = catalog.load_table(generation)
            got.update(table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())
            snapshots, regressions = control_offset_regressions(table, sink)
            verdict.snapshots += snapshots
            problems.extend(f"{generation}: {text}" for text in regressions)
        duplicates = sum((got - expected).values())
        losses = sum((expected - got).values())
        verdict.rows += sum(got.values())
        verdict.duplicates += duplicates
        verdict.losses += losses
        if duplicates or losses:
            sample = sorted((got - expected) + (expected - got))[:5]
            across = f" (across {', '.join(generations[name])})" if len(generations[name]) > 1 else ""
            problems.append(f"{name}: {duplicates} duplicate and {losses} lost rows{across}, e.g. {sample}")
        landed.update(got)

    dead = dead_letter_coordinates(bootstrap, dead_letter_topic)
    verdict.dead_lettered = sum(dead.values())
    verdict.filtered = len(truth.filtered)
    missing = sorted((truth.bad - dead).elements())
    repeated = sorted(c for c in (dead - truth.bad) if c in truth.bad)
    stray = sorted(set(dead) - set(truth.bad))
    if missing or repeated or stray:
        extra = sum((dead - truth.bad).values())
        problems.append(
            f"dead letters: {len(missing)} bad records missing, {extra} unexpected or repeated "
            f"(e.g. missing {missing[:3]}, repeated {repeated[:3]}, unexpected {stray[:3]})"
        )
    if landed & truth.filtered:
        problems.append(f"{len(landed & truth.filtered)} filtered records landed in a table")
    dead_letters = sum((dead & truth.bad).values()) + len(stray)
    accounted = len(landed) + dead_letters + len(truth.filtered)
    if accounted != truth.records:
        problems.append(
            f"records in {truth.records} != routed {len(landed)} + dead-lettered {dead_letters} "
            f"+ filtered {len(truth.filtered)}"
        )
    return verdict


def _verify_changes(
    bootstrap: str, traffic: ChangeTraffic, generations: list[str], sink: str, catalog: Any, verdict: Verdict
) -> None:
    """The change topic against the stream, then the change table key by key against the model."""
    problems = verdict.problems
    messages = read_to_end(bootstrap, [traffic.topic])
    verdict.changes = len(messages)
    found: dict[bytes, list[bytes | None]] = {}
    partitions: dict[bytes, set[int]] = {}
    for message in messages:
        key = message.key() or b""
        found.setdefault(key, []).append(message.value())
        partitions.setdefault(key, set()).add(message.partition() or 0)
    sent: dict[bytes, list[bytes | None]] = {}
    for key, value in zip(traffic.keys, traffic.values, strict=True):
        sent.setdefault(key, []).append(value)
    if found != sent:
        differing = sorted(k for k in found.keys() | sent.keys() if found.get(k) != sent.get(k))
        problems.append(
            f"{traffic.topic}: holds {len(messages)} messages, the change stream {len(traffic)}; "
            f"{len(differing)} keys' messages differ from the stream (e.g. {differing[:3]}): "
            "the model does not apply"
        )
    split = sorted(k for k, p in partitions.items() if len(p) > 1)
    if split:
        problems.append(f"{traffic.topic}: {len(split)} keys in more than one partition, e.g. {split[:3]}")

    verdict.change_keys = len(traffic.model)
    if not generations:
        problems.append(f"{changes.TABLE}: missing, {len(traffic.model)} keys expected")
        verdict.change_missing += len(traffic.model)
        return
    if len(generations) > 1:  # no swap renames the change table aside (see kills): its rows split
        problems.append(f"{changes.TABLE}: held by {generations}, expected one table; the last checked")
    table = catalog.load_table(generations[-1])
    check = check_state(table.scan().to_arrow(), traffic.model)
    verdict.change_rows += check.rows
    verdict.change_missing += check.missing
    verdict.change_extra += check.extra
    verdict.change_wrong += check.differing
    verdict.change_duplicate_keys += check.duplicated
    if check.mismatches:
        problems.append(
            f"{changes.TABLE}: {check.rows} rows for {check.expected} keys: {check.missing} missing, "
            f"{check.extra} extra, {check.differing} wrong-value and {check.duplicated} duplicate keys, "
            f"e.g. {check.examples[:5]}"
        )
    snapshots, regressions = control_offset_regressions(table, sink)
    verdict.snapshots += snapshots
    problems.extend(f"{changes.TABLE}: {text}" for text in regressions)


def table_generations(existing: set[str]) -> dict[str, list[str]]:
    """Each table name with the tables that held it over time: the ones a swap renamed aside to
    ``<name>_old_<n>`` (oldest first), then the current one, if any. A record must land exactly once
    across them."""
    generations: dict[str, list[tuple[int, str]]] = {}
    for name in existing:
        match = _ASIDE.fullmatch(name)
        base, serial = (match["base"], int(match["serial"])) if match else (name, sys.maxsize)
        generations.setdefault(base, []).append((serial, name))
    return {base: [name for _, name in sorted(names)] for base, names in generations.items()}


def _list_tables(catalog: Any, namespace: str) -> list[tuple[str, ...]]:
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        return list(catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []
