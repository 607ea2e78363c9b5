"""The bad-input corpus through the real app (real broker, Spark, catalog), both tolerances.

Partition 0 of the source topic holds only good records; partition 1 holds a few good ones, then
the corpus, each bad record between two good ones. Topics and clients allow the corpus's multi-MB
record.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Message, Producer
from support.bad_records import (
    CASES,
    CLICKS,
    HUGE_STRING_BYTES,
    ORDERS,
    BadRecord,
    assert_dead_letter,
    good_record,
    interleaved,
    sink_settings,
)
from support.common import sink_group_offset
from support.sink_factory import SinkFactory, SinkUnderTest

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.transform.records import DeadLetter

pytestmark = pytest.mark.usefixtures("own_spark")

MAX_MESSAGE = str(4 * HUGE_STRING_BYTES)
GOOD_ONLY = 20  # good records in partition 0
GOOD_FIRST = 10  # good records in partition 1 before the corpus
_BATCH_LINE = re.compile(
    r"batch \d+: (\d+) records in, (\d+) already delivered, (\d+) dead-lettered, (\d+) filtered"
)


class Produced:
    """What was produced where: offsets of bad cases and good ids per partition."""

    def __init__(self) -> None:
        self.bad: dict[int, BadRecord] = {}  # partition 1 offset -> case
        self.good: dict[tuple[int, int], tuple[int, str | None]] = {}  # (partition, offset) -> (id, table)


def _produce(bootstrap: str, topic: str) -> Produced:
    produced = Produced()
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": MAX_MESSAGE, "linger.ms": 5})
    pending: list[tuple[int, BadRecord | int]] = [(0, 1000 + i) for i in range(GOOD_ONLY)]
    pending += [(1, 2000 + i) for i in range(GOOD_FIRST)] + [(1, entry) for entry in interleaved()]

    def send(partition: int, entry: BadRecord | int) -> None:
        def delivered(error: Any, message: Message) -> None:
            assert error is None, error
            if isinstance(entry, BadRecord):
                produced.bad[message.offset()] = entry
            else:
                produced.good[(partition, message.offset())] = (entry, good_record(entry)[1])

        if isinstance(entry, BadRecord):
            key, value, headers = entry.key, entry.value, list(entry.headers)
        else:
            key, value, headers = f"good-{entry}".encode(), good_record(entry)[0], []
        producer.produce(topic, value, key, partition=partition, headers=headers, on_delivery=delivered)
        producer.flush(30)  # one at a time: offsets follow the corpus order

    for partition, entry in pending:
        send(partition, entry)
    assert len(produced.bad) == len(CASES) and len(produced.good) == len(pending) - len(CASES)
    return produced


def _sink(sink_factory: SinkFactory, **overrides: Any) -> tuple[SinkUnderTest, str]:
    """The corpus sink (``sink_settings``) on a two-partition topic; topic and clients allow the
    corpus's multi-MB record."""
    sections = sink_settings(**overrides)
    run = sink_factory(
        partitions={"corpus": 2},
        topic_config={"max.message.bytes": MAX_MESSAGE},
        kafka={"message.max.bytes": MAX_MESSAGE},
        source=sections.pop("source"),
        overrides=sections,
    )
    return run, run.topic


def test_tolerance_all_dead_letters_every_bad_record_once(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    read_topic: Callable[..., list[Message]],
    sink_factory: SinkFactory,
) -> None:
    dlq = make_topic("corpus-dlq", config={"max.message.bytes": MAX_MESSAGE})
    sink_run, topic = _sink(sink_factory, **{"dead-letter": {"topic": dlq}})
    produced = _produce(bootstrap_servers, topic)
    log = sink_run.run("--available-now")

    letters = read_topic(dlq)
    by_offset: dict[int, list[DeadLetter]] = {}
    for message in letters:
        letter = DeadLetter(message.key(), message.value(), list(message.headers() or []))
        offset = int(dict(letter.headers)["fanout-sink.source.offset"])
        by_offset.setdefault(offset, []).append(letter)
    assert sorted(by_offset) == sorted(produced.bad), "dead letters are exactly the bad records"
    for offset, case in produced.bad.items():
        assert len(by_offset[offset]) == 1, f"{case.name}: {len(by_offset[offset])} dead letters"
        assert_dead_letter(by_offset[offset][0], case, topic, 1, offset)

    for table in (ORDERS, CLICKS):
        sink_run.expected[table] = {i for i, t in produced.good.values() if t == table}
    sink_run.assert_exact()

    counts = [tuple(int(n) for n in m) for m in _BATCH_LINE.findall(log)]
    records_in, delivered, dead, filtered = (sum(c[i] for c in counts) for i in range(4))
    rows = sum(len(ids) for ids in sink_run.expected.values())
    assert (records_in, delivered) == (len(produced.bad) + len(produced.good), 0)
    assert (dead, filtered) == (len(CASES), sum(1 for _, t in produced.good.values() if t is None))
    assert records_in == rows + dead + filtered


def test_tolerance_none_stops_at_the_first_bad_record_and_again_after_restart(
    bootstrap_servers: str, catalog_settings: CatalogSettings, sink_factory: SinkFactory
) -> None:
    sink_run, topic = _sink(
        sink_factory,
        source={"topics": [], "format": "json", "tombstones": "skip"},
        errors={"tolerance": "none"},
        **{"dead-letter": None},
    )
    produced = _produce(bootstrap_servers, topic)
    first = min(offset for offset, case in produced.bad.items() if case.error)
    named = f"record {topic}[1]@{first} failed at {produced.bad[first].stage}"

    for attempt in ("first run", "restart"):
        # Small batches: the good records before the bad one are delivered by an earlier batch.
        result = sink_run.attempt("--available-now", "--max-offsets-per-trigger", "12")
        assert result.returncode != 0, attempt
        # The last words are the record and what to do, not Spark's traces.
        error, stopped, fix = result.stderr.strip().splitlines()[-3:]
        assert error.startswith(f"fanout-sink: {named}: invalid JSON"), (attempt, result.stderr[-3000:])
        # Quiet: the three lines are the stop's only account; the task's traceback only at DEBUG.
        assert "Traceback" not in result.stderr, result.stderr[-6000:]
        longest = max(result.stderr.splitlines(), key=len)
        assert len(longest) < 400, longest

        committed = sink_group_offset(bootstrap_servers, sink_run.name, topic, 1)
        assert committed is not None and 0 < committed <= first, (attempt, committed)
        # Where the next run reads the partition from (the sink group's offset), not the record's offset.
        again = f"committed up to offset {committed}, so a restart reads it again from offset {committed}"
        assert again in stopped and fix.startswith("  fix: "), (stopped, fix)
        in_tables = _all_ids(catalog_settings)
        for (partition, offset), (i, table) in produced.good.items():
            if partition == 1 and table is not None:
                assert (i in in_tables) == (offset < committed), (attempt, offset, committed)


def _all_ids(settings: CatalogSettings) -> set[int]:
    catalog = load_catalog(settings)
    ids: set[int] = set()
    for table in (ORDERS, CLICKS):
        if catalog.table_exists(table):
            ids |= set(catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())
    return ids
