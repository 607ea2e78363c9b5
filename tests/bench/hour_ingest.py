"""A simulated hour of the sink's commits, compressed in time and nothing else.

Each round stands for one commit interval (10 s by default): the records of that interval are
produced to the source partitions (Kafka timestamps spread over the interval, so over the hour in
total), then each partition's slice is delivered by a real :class:`SliceWorker` (fence, stable
offset read, ``RangeReader``, routing, Parquet, one Kafka transaction), then one real
``Coordinator.commit_round`` appends every table's files. The only thing skipped is the wait
between rounds, so an hour of 10 s commits leaves the same files, snapshots and manifests in each
table as the sink would, in the minutes the work itself takes.
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.cimpl import NewPartitions, NewTopic
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import HourTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from fanout_sink.catalog import CatalogSettings
from fanout_sink.config.loading import parse_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.slices import Slice
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform.processor import build_processor
from fanout_sink.transform.records import SliceProcessor

NAMESPACE = "bench"
ROUTE_FIELD = "t"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, ROUTE_FIELD, StringType(), required=False),
    NestedField(3, "session", StringType(), required=False),
    NestedField(4, "page", StringType(), required=False),
    NestedField(5, "country", StringType(), required=False),
    NestedField(6, "amount", DoubleType(), required=False),
    NestedField(7, "ts", TimestamptzType(), required=False),
)
SPEC = PartitionSpec(PartitionField(source_id=7, field_id=1000, transform=HourTransform(), name="ts_hour"))
"""Hourly partitions, as an events table would have: the simulated hour spans two of them mostly."""
COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "ES", "IT", "US", "GB", "JP")
_PAGES = ("/", "/search", "/cart", "/checkout", "/product", "/account", "/help")


@dataclass(frozen=True)
class HourPlan:
    """What to stream: ``rounds`` commit intervals of ``interval_s`` into ``tables`` tables, with
    ``records`` records per source partition per round (spread evenly over the tables)."""

    rounds: int = 360
    tables: int = 10
    partitions: int = 2
    records: int = 200
    interval_s: float = 10.0

    @property
    def simulated_s(self) -> float:
        return self.rounds * self.interval_s

    def table_names(self) -> list[str]:
        return [f"{NAMESPACE}.t{n:02d}" for n in range(self.tables)]


@dataclass
class IngestResult:
    """What the ingest did: records delivered, the sink's own seconds (slices + commit rounds, not
    producing), and each round's commit seconds (they grow with the table's metadata)."""

    records: int = 0
    slice_s: float = 0.0
    commit_s: float = 0.0
    produce_s: float = 0.0
    start_ms: int = 0
    end_ms: int = 0
    round_commit_s: list[float] = field(default_factory=list)
    round_done_ms: list[int] = field(default_factory=list)
    """Wall clock at the end of each round: when its snapshots were committed."""

    @property
    def sink_s(self) -> float:
        return self.slice_s + self.commit_s

    @property
    def records_per_s(self) -> float:
        return self.records / self.sink_s if self.sink_s else 0.0

    def commit_median_s(self, first: bool, count: int = 10) -> float:
        """Median commit-round seconds of the first (or last) ``count`` rounds."""
        chosen = self.round_commit_s[:count] if first else self.round_commit_s[-count:]
        return statistics.median(chosen) if chosen else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "sink_s": round(self.sink_s, 3),
            "slice_s": round(self.slice_s, 3),
            "commit_s": round(self.commit_s, 3),
            "produce_s": round(self.produce_s, 3),
            "records_per_s": round(self.records_per_s, 1),
            "commit_round_median_first_10_s": round(self.commit_median_s(first=True), 4),
            "commit_round_median_last_10_s": round(self.commit_median_s(first=False), 4),
        }


def sink_config(
    name: str,
    bootstrap: str,
    topic: str,
    settings: CatalogSettings,
    plan: HourPlan,
    maintenance: dict[str, Any] | None = None,
) -> SinkConfig:
    """The sink's config: one route per table by the ``t`` field, the ``maintenance:`` section given,
    everything else at its default."""
    return parse_config(
        {
            "name": name,
            "kafka": {"bootstrap.servers": bootstrap},
            "source": {"topics": [topic], "format": "json"},
            "control": {"topic": f"{name}-control", "commit-interval": f"{plan.interval_s:g}s"},
            "catalog": settings.model_dump(),
            "tables": {
                table: {"when": f"{ROUTE_FIELD} == '{table.removeprefix(NAMESPACE + '.')}'"}
                for table in plan.table_names()
            },
            "maintenance": maintenance or {},
        },
        "maintenance benchmark",
    )


def create_tables(catalog: Any, plan: HourPlan) -> None:
    """The tables up front (typed ``ts``, hourly partitions), as a user would create an events table."""
    catalog.create_namespace_if_not_exists(NAMESPACE)
    for name in plan.table_names():
        catalog.create_table(name, schema=SCHEMA, partition_spec=SPEC)


PARTITIONS_PER_REQUEST = 5_000
"""Partitions one admin request adds: a KRaft controller refuses an operation of more than 10,000
metadata records (``POLICY_VIOLATION``, "excessively large batch operation"), and a topic's creation
is a record per partition, so 10,000 partitions are made in two requests."""


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
    created = min(partitions, PARTITIONS_PER_REQUEST)
    admin.create_topics([NewTopic(topic, created, 1)])[topic].result(timeout=30)
    while created < partitions:
        created = min(partitions, created + PARTITIONS_PER_REQUEST)
        admin.create_partitions([NewPartitions(topic, created)])[topic].result(timeout=60)


def round_values(plan: HourPlan, first_id: int, start_ms: int, rng: random.Random) -> list[tuple[int, bytes]]:
    """One partition's records of one round: ``(timestamp ms, JSON value)``, timestamps spread evenly
    over the round's interval, tables taken in turn so every table gets records from every slice."""
    step_ms = plan.interval_s * 1000 / plan.records
    out = []
    for n in range(plan.records):
        ts = start_ms + int(n * step_ms)
        record = {
            "id": first_id + n,
            ROUTE_FIELD: f"t{n % plan.tables:02d}",
            "session": f"s-{rng.randrange(20_000):05d}",
            "page": rng.choice(_PAGES),
            "country": rng.choice(COUNTRIES),
            "amount": round(rng.uniform(1, 500), 2),
            "ts": ts,
        }
        out.append((ts, json.dumps(record, separators=(",", ":")).encode()))
    return out


class HourIngest:
    """Streams the plan's rounds into the config's tables; ``run()`` returns the :class:`IngestResult`.

    Each source partition has a slot of its own (worker, reader, processor), as each Spark executor
    process has, and ``parallel`` slices run at once, as ``local[2]`` runs two tasks.

    The simulated hour ends now (rounded down to the interval), so the records' timestamps are
    recent: a broker's time-based retention keeps them, and VTTS looks as it would live.
    """

    def __init__(
        self, config: SinkConfig, catalog: Any, plan: HourPlan, parallel: int = 2, seed: int = 3
    ) -> None:
        self.config = config
        self.parallel = max(1, parallel)
        self.catalog = catalog
        self.plan = plan
        self.topic = config.source.topics[0]
        self.rng = random.Random(seed)
        self.next_offsets = dict.fromkeys(range(plan.partitions), 0)

    def _produce(self, producer: Producer, round_start_ms: int, first_id: int) -> dict[int, int]:
        """One round's records to every partition; returns each partition's end offset."""
        ends: dict[int, int] = {}

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                raise RuntimeError(f"producing to {msg.topic()}[{msg.partition()}] failed: {err}")
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

        for partition in range(self.plan.partitions):
            values = round_values(
                self.plan, first_id + partition * self.plan.records, round_start_ms, self.rng
            )
            for ts, value in values:
                producer.produce(
                    self.topic, value=value, partition=partition, timestamp=ts, on_delivery=delivered
                )
        if producer.flush(60) != 0:
            raise RuntimeError(f"records for {self.topic} still unsent after 60 s")
        return ends

    def _deliver(self, slot: Slot, partition: int, end: int) -> int:
        """One partition's slice of the round, as a Spark task delivers it; returns its records."""
        start = self.next_offsets[partition]
        read = functools.partial(
            slot.reader.read_chunks, self.topic, partition, max_records=slot.worker.writer.chunk_records
        )
        sliced = slot.worker.commit_slice(Slice(self.topic, partition, start, end), read, slot.processor)
        if not sliced.transaction_committed:
            raise RuntimeError(f"slice {self.topic}[{partition}] {start}..{end} was not committed")
        self.next_offsets[partition] = end
        return sliced.records_in

    def run(self, progress_every: int = 60) -> IngestResult:
        plan = self.plan
        interval_ms = int(plan.interval_s * 1000)
        end_ms = int(time.time() * 1000) // interval_ms * interval_ms
        result = IngestResult(start_ms=end_ms - plan.rounds * interval_ms, end_ms=end_ms)
        channel = SinkChannel.from_config(self.config, PartitionGroups())  # a slot per partition
        producer = channel.clients.producer({"enable.idempotence": True, "linger.ms": 5})
        slots = [Slot.open(self.config, self.catalog) for _ in range(plan.partitions)]
        coordinator = Coordinator(
            channel,
            self.catalog,
            CoordinatorSettings(source_topics=(self.topic,), commit_interval_s=plan.interval_s),
        )
        coordinator.open()
        try:
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="slice") as pool:
                for n in range(plan.rounds):
                    started = time.perf_counter()
                    first_id = n * plan.partitions * plan.records
                    ends = self._produce(producer, result.start_ms + n * interval_ms, first_id)
                    produced = time.perf_counter()
                    tasks = [pool.submit(self._deliver, slots[p], p, end) for p, end in sorted(ends.items())]
                    result.records += sum(task.result() for task in tasks)
                    delivered = time.perf_counter()
                    committed = coordinator.commit_round()
                    finished = time.perf_counter()
                    failed = [t for t, c in committed.tables.items() if c.outcome != "committed"]
                    if failed:
                        raise RuntimeError(f"round {n}: tables {failed} not committed: {committed.tables}")
                    result.produce_s += produced - started
                    result.slice_s += delivered - produced
                    result.commit_s += finished - delivered
                    result.round_commit_s.append(finished - delivered)
                    result.round_done_ms.append(int(time.time() * 1000))
                    if progress_every and (n + 1) % progress_every == 0:
                        print(
                            f"round {n + 1}/{plan.rounds}: {result.records:,} records, "
                            f"last commit round {finished - delivered:.3f} s",
                            flush=True,
                        )
        finally:
            coordinator.close()
            for slot in slots:
                slot.close()
            producer.flush(30)
        return result


@dataclass
class Slot:
    """What one Spark executor process keeps for its tasks: a worker, a range reader, a processor."""

    worker: SliceWorker
    reader: RangeReader
    processor: SliceProcessor

    @classmethod
    def open(cls, config: SinkConfig, catalog: Any) -> Slot:
        channel = SinkChannel.from_config(config, PartitionGroups())  # a slot per partition
        return cls(
            SliceWorker(channel),
            RangeReader(channel.clients, channel.sink_group),
            build_processor(config, catalog),
        )

    def close(self) -> None:
        self.worker.close()
        self.reader.close()
