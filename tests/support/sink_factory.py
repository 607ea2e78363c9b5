"""One sink under test, made by one factory: its topics, catalog, config, channel and children.

A test asks the ``sink_factory`` fixture for a sink (the habit of quix-streams' ``app_factory``
fixtures: a fixture that returns a function making a configured object) and gets a
:class:`SinkUnderTest`: topics created on the broker, an embedded catalog, a real ``sink.yaml``
with its parsed :class:`~fanout_sink.config.models.SinkConfig`, and the ways a test drives the sink: the
worker and coordinator in process, their scripts in child processes (killed at named fault points),
or the whole app (``fanout-sink run``) in a child.

Two routings cover the suite. By default the sink routes the sample shop events
(``fanout_sink.devtools.sample_data``) to static tables by type and to dynamic ``raw.<type>`` tables,
and :meth:`SinkUnderTest.produce` records the ids each table must hold. With ``tables="ab"`` it is the
protocol tests' sink: tables ``sink.a`` and ``sink.b`` are created and records route by their
``table`` field, as ``support.common.make_processor`` does in process.

Fixtures that share one app run across a module (scope ``module``) call :func:`new_sink` directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Protocol

import pytest
import yaml
from chaos.app_process import child_env
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from support.common import (
    NAMESPACE,
    commit_checkpoint_batch,
    create_tables,
    create_topic,
    embedded_catalog_settings,
    end_offset,
    make_processor,
    produce_json,
    read_slice,
    run_batch,
    sink_channel,
    sink_group_offset,
    write_checkpoint_batch,
)

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.devtools.sample_data import shop_events
from fanout_sink.protocol.channel import SinkChannel
from fanout_sink.protocol.coordinator import Coordinator, CoordinatorSettings
from fanout_sink.protocol.slices import Slice, SliceResult
from fanout_sink.protocol.worker import SliceWorker
from fanout_sink.spark import planning
from fanout_sink.transform.records import SliceProcessor

STATIC = {"shop.orders": "order", "shop.payments": "payment", "shop.clicks": "click"}
"""The shop sink's static tables and the event type each one takes."""
DYNAMIC = {"raw.order": "order", "raw.payment": "payment", "raw.click": "click"}
"""The dynamic ``raw.<type>`` tables the shop events create."""
SHOP_TOPICS = {"orders": 3, "clicks": 2}
"""The shop sink's source topics by role, with their partitions."""
SCRIPTS = Path(__file__).parent
"""Where the worker and coordinator scripts for child processes live (``run_<role>.py``)."""


def shop_routes() -> dict[str, Any]:
    """The shop sink's ``tables`` and ``dynamic`` sections."""
    return {
        "tables": {table: {"when": f"type == '{kind}'"} for table, kind in STATIC.items()},
        "dynamic": {
            "table": "join('.', ['raw', type])",
            "allow": "^raw\\.[a-z]+$",
            "auto-create": True,
            "applies-to": "all",
        },
    }


def field_routes(tables: Iterable[str]) -> dict[str, Any]:
    """The protocol sink's ``tables`` section: ``sink.<t>`` takes the records whose ``table`` is ``t``."""
    return {"tables": {f"{NAMESPACE}.{t}": {"when": f"table == '{t}'"} for t in tables}}


@dataclass
class SinkUnderTest:
    """One sink under test: its name, topics, catalog, ``sink.yaml`` and the ways to run it."""

    name: str
    bootstrap: str
    """The broker's listener for the test's own clients (the sink's may differ, e.g. TLS)."""
    topics: dict[str, str]
    """Source topics by role (``orders``, ``clicks``, ``src``, ...)."""
    partitions: dict[str, int]
    """Partitions per source topic name."""
    settings: CatalogSettings
    folder: Path
    """Where the sink's files live: ``<name>.yaml``, ``checkpoints/<name>``, and (unless the test's own
    catalog is used) an embedded catalog."""
    config_file: Path
    catalog: Any
    expected: dict[str, set[Any]] = field(default_factory=dict)
    """Ids each table must hold, exactly (filled by :meth:`produce`)."""
    produced: int = 0
    batch_id: int = 0
    """The Spark batch the child worker replays next (see :meth:`plan`)."""

    # -- what the sink is

    @cached_property
    def config(self) -> SinkConfig:
        """The parsed ``sink.yaml`` (``${VAR}`` substituted from this process's environment)."""
        return load_config(self.config_file)

    @cached_property
    def channel(self) -> SinkChannel:
        """The sink's channel (:func:`~support.common.sink_channel`): its children use the same."""
        return sink_channel(self.config)

    @property
    def kafka(self) -> dict[str, str]:
        """Client settings for the test's own clients on :attr:`bootstrap`."""
        return {"bootstrap.servers": self.bootstrap}

    @property
    def control_topic(self) -> str:
        return self.config.control_topic

    @property
    def checkpoint(self) -> Path:
        """Spark's checkpoint of this sink (one folder per sink name below ``spark.checkpoint-location``)."""
        return Path(self.config.checkpoint_location)

    @property
    def topic(self) -> str:
        """The one source topic of a single-topic sink."""
        (only,) = self.partitions
        return only

    # -- the worker and coordinator in this process

    def worker(self, timeout_s: float | None = None, **options: Any) -> SliceWorker:
        """A worker of the sink (``timeout_s``: its Kafka calls' bound, if not the channel's default)."""
        return SliceWorker(self._channel(timeout_s), **options)

    def coordinator(self, timeout_s: float | None = None, opened: bool = True, **options: Any) -> Coordinator:
        """A coordinator of the sink's source topics, opened unless ``opened`` is false (``timeout_s``
        as for :meth:`worker`); ``options`` are :class:`CoordinatorSettings` fields and collaborators
        (``table_commits``, ``rounds``, ...), sorted here."""
        named = {f.name for f in fields(CoordinatorSettings)}
        settings = CoordinatorSettings(
            source_topics=tuple(self.partitions), **{k: v for k, v in options.items() if k in named}
        )
        collaborators = {k: v for k, v in options.items() if k not in named}
        coordinator = Coordinator(self._channel(timeout_s), self.catalog, settings, **collaborators)
        if opened:
            coordinator.open()
        return coordinator

    def _channel(self, timeout_s: float | None) -> SinkChannel:
        return self.channel if timeout_s is None else replace(self.channel, timeout_s=timeout_s)

    def batch(
        self, worker: SliceWorker | None = None, process: SliceProcessor | None = None
    ) -> list[SliceResult]:
        """One micro-batch over every source partition (``support.common.run_batch``); with a worker
        of its own unless one is given, and ``support.common.make_processor`` unless ``process`` is."""
        own = worker or self.worker()
        try:
            return run_batch(own, self.bootstrap, self.partitions, process or make_processor(self.catalog))
        finally:
            if worker is None:
                own.close()

    def deliver(self, worker: SliceWorker, end: int, partition: int = 0) -> SliceResult:
        """Deliver ``[0, end)`` of a partition of :attr:`topic` in one committed worker transaction."""
        raw = read_slice(self.bootstrap, self.topic, partition, 0, end)
        result = worker.commit_slice(Slice(self.topic, partition, 0, end), raw, make_processor(self.catalog))
        assert result.transaction_committed
        return result

    def committed(self, topic: str, partition: int, stable: bool = True) -> int | None:
        """The sink group's offset (``stable=False``: without waiting for pending transactions, as a
        killed attempt's stays open until it is fenced)."""
        return sink_group_offset(self.bootstrap, self.name, topic, partition, stable=stable)

    # -- the worker and coordinator scripts in child processes, replaying Spark's checkpoint

    def plan(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Spark plans batch :attr:`batch_id` (writes ``offsets/<batch>``): up to each partition's
        last stable offset now. A killed worker's batch has no commit marker, so the next run
        replays the same ranges, as Spark does after a crash."""
        ends = {
            t: {p: end_offset(self.bootstrap, t, p) for p in range(n)} for t, n in self.partitions.items()
        }
        write_checkpoint_batch(self.checkpoint, self.batch_id, ends, committed=False)
        return planning.planned_ranges(str(self.checkpoint), self.batch_id)

    def done(self) -> None:
        """``foreachBatch`` returned: Spark marks the batch done (``commits/<batch>``) and moves on."""
        commit_checkpoint_batch(self.checkpoint, self.batch_id)
        self.batch_id += 1

    def child_command(self, role: Literal["worker", "coordinator"], *args: str) -> list[str]:
        """``tests/support/run_<role>.py`` on this sink's YAML: the worker replays batch
        :attr:`batch_id`, the coordinator runs one round (or serves, given its intervals as JSON)."""
        script = [
            sys.executable,
            "-X",
            "faulthandler",
            str(SCRIPTS / f"run_{role}.py"),
            str(self.config_file),
        ]
        return [*script, str(self.batch_id), *args] if role == "worker" else [*script, *args]

    def start_child(self, role: Literal["worker", "coordinator"], faults: str = "") -> subprocess.Popen[str]:
        """Start the worker or coordinator script with ``FANOUT_SINK_FAULTS`` set to ``faults``."""
        return subprocess.Popen(
            self.child_command(role),
            env={**os.environ, "FANOUT_SINK_FAULTS": faults},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run_child(self, role: Literal["worker", "coordinator"], faults: str = "", expect: int = 0) -> str:
        """Run the worker or coordinator script to its end, which must be exit code ``expect``; its stdout."""
        proc = self.start_child(role, faults)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == expect, f"{role} exited {proc.returncode}, wanted {expect}:\n{err[-3000:]}"
        return out

    # -- the app in a child process, on the shop events

    def produce(self, count: int, roles: Collection[str] | None = None) -> None:
        """Produce the next ``count`` shop events in one transaction and expect their ids; with
        ``roles``, only the events of those topics (the others' ids are skipped, not expected)."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"{self.name}-source"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for event in shop_events(count, start=self.produced):
            if roles is not None and event.topic not in roles:
                continue
            producer.produce(self.topics[event.topic], key=event.key, value=event.value)
            kind = event.key.decode().split("-")[0]
            for table, wanted in {**STATIC, **DYNAMIC}.items():
                if wanted == kind:
                    self.expected.setdefault(table, set()).add(event.key.decode())
            producer.poll(0)
        producer.commit_transaction(60)
        self.produced += count

    def command(self, *args: str) -> list[str]:
        """``fanout-sink run --config sink.yaml <args>``."""
        return [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(self.config_file), *args]

    def attempt(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 420
    ) -> subprocess.CompletedProcess[str]:
        """Run the app to its end, whatever its exit code."""
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=child_env(env),
        )

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 420) -> str:
        """Run the app, which must exit 0; returns its stderr (the sink's log)."""
        result = self.attempt(*args, env=env, timeout=timeout)
        assert result.returncode == 0, result.stderr[-4000:]
        return result.stderr

    def table_ids(self) -> dict[str, list[str]]:
        """Every id of each expected table, sorted, duplicates kept."""
        catalog = load_catalog(self.settings)
        return {
            table: sorted(
                catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
            )
            for table in self.expected
        }

    def assert_exact(self) -> None:
        """Each expected table holds exactly its expected ids: none missing, none twice."""
        got = self.table_ids()
        for table, ids in self.expected.items():
            duplicates = len(got[table]) - len(set(got[table]))
            assert duplicates == 0, f"{table}: {duplicates} duplicate rows"
            assert set(got[table]) == ids, f"{table}: missing {len(ids - set(got[table]))}"


def new_sink(
    bootstrap: str,
    folder: Path,
    settings: CatalogSettings | None = None,
    *,
    partitions: Mapping[str, int] = SHOP_TOPICS,
    topics: Mapping[str, str] | None = None,
    topic_config: Mapping[str, str] | None = None,
    catalog: Any = None,
    name: str | None = None,
    prefix: str = "sink",
    tables: str = "",
    kafka: Mapping[str, str] | None = None,
    source: Mapping[str, Any] | None = None,
    commit_interval: str = "2s",
    commit_min_interval: str | None = None,
    partition_groups: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SinkUnderTest:
    """Create a sink's topics, write its YAML (``<name>.yaml``) into ``folder`` and return the sink.

    Topics (``partitions``: role -> partitions, with ``topic_config``) are created on ``bootstrap``
    unless ``topics`` names existing ones (role -> name; none: ``source`` may name a ``pattern``).
    The sink is called ``name``, or ``<prefix>-<random>``. ``settings`` defaults to a fresh embedded
    catalog in ``folder``; ``tables`` (e.g. ``"ab"``) makes the protocol tests' sink and creates its
    tables; ``kafka`` and ``source`` add to those sections; ``partition_groups`` packs the source
    partitions (``spark.partition-groups``; none: one group per partition outside the app, which
    decides a count at start); ``overrides`` replaces top-level sections.
    """
    if topics is None:
        topics = {role: create_topic(bootstrap, role, n, topic_config) for role, n in partitions.items()}
        counts = {topics[role]: n for role, n in partitions.items()}
    else:
        counts = _partitions(bootstrap, topics.values())
    folder.mkdir(parents=True, exist_ok=True)
    settings = settings or embedded_catalog_settings(folder)
    catalog = catalog if catalog is not None else load_catalog(settings)
    if tables:
        create_tables(catalog, tables)
    name = name or f"{prefix}-{uuid.uuid4().hex[:6]}"
    sink: dict[str, Any] = {
        "name": name,
        "kafka": {"bootstrap.servers": bootstrap, **(kafka or {})},
        "source": {
            "format": "json",
            **(source or {}),
            **({"topics": sorted(topics.values())} if topics else {}),
        },
        "control": {
            "topic": f"{name}-control",
            "commit-interval": commit_interval,
            **({"commit-min-interval": commit_min_interval} if commit_min_interval else {}),
        },
        "catalog": settings.model_dump(),
        **(field_routes(tables) if tables else shop_routes()),
        "spark": {
            "checkpoint-location": str(folder / "checkpoints"),
            "master": "local[2]",
            **({"partition-groups": partition_groups} if partition_groups else {}),
        },
        **(overrides or {}),
    }
    config_file = folder / f"{name}.yaml"  # one folder may hold several sinks
    config_file.write_text(yaml.safe_dump(sink))
    return SinkUnderTest(name, bootstrap, dict(topics), counts, settings, folder, config_file, catalog)


def _partitions(bootstrap: str, topics: Iterable[str]) -> dict[str, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(timeout=30).topics
    return {topic: len(found[topic].partitions) for topic in sorted(set(topics))}


class SinkFactory(Protocol):
    """What the ``sink_factory`` fixture returns: :func:`new_sink` on the suite's broker and the
    test's folder and catalog, unless ``bootstrap`` or ``folder`` say otherwise."""

    def __call__(
        self, *, bootstrap: str | None = None, folder: Path | None = None, **options: Any
    ) -> SinkUnderTest: ...


@pytest.fixture
def sink_factory(request: pytest.FixtureRequest, tmp_path: Path) -> SinkFactory:
    """Makes sinks for this test: ``sink_factory(partitions={"src": 2}, tables="ab")`` (see
    :func:`new_sink`). Their topics are on the suite's shared broker unless ``bootstrap`` names
    another. Sinks live in ``tmp_path`` with the test's ``catalog``; with ``folder``, a sink gets its
    own embedded catalog there.
    """

    def make(*, bootstrap: str | None = None, folder: Path | None = None, **options: Any) -> SinkUnderTest:
        server = bootstrap or request.getfixturevalue("bootstrap_servers")
        if folder is not None:
            return new_sink(server, folder, **options)
        settings = request.getfixturevalue("catalog_settings")
        return new_sink(server, tmp_path, settings, catalog=request.getfixturevalue("catalog"), **options)

    return make


def packed_sink(
    sink_factory: SinkFactory, groups: int | None, partitions: int = 4, prefix: str = "pack"
) -> tuple[SinkUnderTest, dict[str, list[int]]]:
    """Tables a and b, ten records per partition of a ``partitions``-partition topic packed into
    ``groups`` partition groups (``None``: one per partition), Spark's batch 0 planned over them; the
    ids expected per table."""
    sink = sink_factory(partitions={"src": partitions}, tables="ab", prefix=prefix, partition_groups=groups)
    expected: dict[str, list[int]] = {"a": [], "b": []}
    for partition in range(partitions):
        values = [{"id": partition * 100 + i, "table": "ab"[i % 2]} for i in range(10)]
        produce_json(sink.bootstrap, sink.topic, partition, values)
        for value in values:
            expected[str(value["table"])].append(int(str(value["id"])))
    sink.plan()
    return sink, {t: sorted(v) for t, v in expected.items()}
