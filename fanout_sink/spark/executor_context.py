"""What the sink's Spark tasks work with on an executor: shipped once by the driver, built once per
Python worker process.

The driver decides the run's channel (its partition-group layout, ``spark/partition_group_count.py``) and the
tasks' config once, and every task gets them as one plain value, :class:`TaskSetup`: no task
derives its channel from the config again, so every process of the run packs alike. A Python
worker process serves many tasks of many batches and commit rounds; its one
:class:`ExecutorContext` (one catalog, the table committer, the slice worker, processor and source
reader) is built on its first task and shared by both kinds: producers, the consumer, catalog
connections and loaded tables outlive a micro-batch.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import threading
from dataclasses import dataclass

from fanout_sink import logs
from fanout_sink.catalog import load_catalog
from fanout_sink.config.models import SinkConfig
from fanout_sink.kafka.java_client import inline_tls_files
from fanout_sink.kafka.range_reader import RangeReader
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.pacing import StepPacer, step_target_s
from fanout_sink.protocol.table_commit import TableCommitter
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.transform.processor import RoutingProcessor, build_processor


@dataclass(frozen=True)
class TaskSetup:
    """The sink's config and channel as the tasks get them (pickled into every task), and the key
    their per-process context is kept under."""

    config: SinkConfig
    channel: SinkChannel
    key: str
    """Identifies the setup across tasks, so a context built for one is never used for another."""

    @classmethod
    def of(cls, config: SinkConfig, channel: SinkChannel) -> TaskSetup:
        """The tasks' copy of the driver's ``config`` and ``channel``: TLS files inlined, since their
        librdkafka clients may run on hosts without the driver's files."""
        kafka = inline_tls_files(config.kafka)
        config = config.model_copy(update={"kafka": kafka})
        channel = dataclasses.replace(channel, kafka=dict(kafka))
        key = hashlib.sha256(f"{config.model_dump_json()}{channel!r}".encode()).hexdigest()
        return cls(config, channel, key)


@dataclass(frozen=True)
class Delivery:
    """What a batch's task delivers its slices with."""

    worker: SliceWorker
    processor: RoutingProcessor
    reader: RangeReader
    pacer: StepPacer
    """Sizes the tasks' steps from this process's measured rate, kept across batches."""


class ExecutorContext:
    """One per Python worker process and :class:`TaskSetup`: its catalog, and what the tasks built on
    it share: the table committer of the commit tasks, the batch tasks' :class:`Delivery`."""

    def __init__(self, setup: TaskSetup) -> None:
        self.setup = setup
        self.catalog = load_catalog(setup.config.catalog)
        self.committer = TableCommitter(setup.config.name, self.catalog)
        self._deliveries: dict[int, Delivery] = {}
        """Per lane (a thread of a task delivering several partition groups): lane 0 is built first."""
        self._lock = threading.Lock()

    @property
    def channel(self) -> SinkChannel:
        return self.setup.channel

    def has_delivery(self) -> bool:
        """Whether a task of this process built the :class:`Delivery` already."""
        with self._lock:
            return 0 in self._deliveries

    def delivery(self, lane: int = 0) -> Delivery:
        """The slice worker, processor and source reader, built by the first batch task. ``lane``: a
        thread of a task that delivers several partition groups at once (``spark.groups-per-task``):
        each lane reads with a consumer of its own and routes with a processor of its own (a reader
        holds one assignment, a processor the parse of its next chunks), over the slice worker (a lock
        per transactional id), the step pacer and the loaded tables that lane 0 holds."""
        with self._lock:
            first = self._deliveries.get(0)
            if first is None:
                config, channel = self.setup.config, self.channel
                first = self._deliveries[0] = Delivery(
                    _slice_worker(config, channel),
                    build_processor(config, self.catalog),
                    RangeReader(channel.clients, channel.sink_group),
                    StepPacer(
                        step_target_s(config.control.commit_interval.total_seconds()),
                        config.spark.max_records_per_batch,
                    ),
                )
                freeze_long_lived()
            if lane not in self._deliveries:
                tables = first.processor.tables
                self._deliveries[lane] = dataclasses.replace(
                    first,
                    processor=RoutingProcessor(self.setup.config, self.catalog, tables=tables),
                    reader=RangeReader(self.channel.clients, self.channel.sink_group),
                )
            return self._deliveries[lane]


def _slice_worker(config: SinkConfig, channel: SinkChannel) -> SliceWorker:
    # The smallest safety age any table's orphan cleanup may use: a slice's files must be announced
    # well within it.
    ages = [config.maintenance, *(t.maintenance for t in config.tables.values() if t.maintenance)]
    return SliceWorker(
        channel,
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
        file_age_limit_s=min(m.orphan_older_than for m in ages).total_seconds(),
        chunk_records=config.spark.max_records_per_batch,
    )


def freeze_long_lived() -> None:
    """Move the process's long-lived objects out of the cyclic garbage collector's reach.

    A slice allocates millions of short-lived container objects (a ``Message`` and a timestamp
    tuple per record), which trigger collections; each full one walked every object the imports
    and the executor state had left (modules, pydantic models, the catalog): 1.3 of the 2.5 CPU
    seconds a worker spent reading 1M records (docs/benchmarks/cpu.md). Frozen objects are never
    walked nor collected: garbage is collected first, and only what exists once the state is
    built is frozen, so later cycles are still collected.
    """
    gc.collect()
    gc.freeze()


_CONTEXTS: dict[str, ExecutorContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def executor_context(setup: TaskSetup) -> ExecutorContext:
    """This Python worker process's context for ``setup``, built by its first task."""
    with _CONTEXTS_LOCK:
        if setup.key not in _CONTEXTS:
            # The executor's lines join the driver's (local) or the executor's log (cluster): alike.
            logs.configure(setup.config.logging.format, setup.config.logging.level)
            _CONTEXTS[setup.key] = ExecutorContext(setup)
        return _CONTEXTS[setup.key]
