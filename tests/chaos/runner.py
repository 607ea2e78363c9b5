"""One chaos run: set up, cycle through breakages while traffic flows, drain, verify, one verdict line."""

from __future__ import annotations

import json
import logging
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.cimpl import NewTopic
from pyiceberg.catalog import Catalog
from support.registry import Registry

from chaos import changes, kills, layout_change, maintenance, registry_lag, scenario
from chaos.app_process import AppProcess, child_env
from chaos.changes import ChangeTraffic, change_traffic, create_change_table
from chaos.traffic import Traffic, flood
from chaos.verify import Verdict, verify
from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.config.fields import parse_duration
from fanout_sink.devtools.stack.broker import KafkaBroker, log_tail
from fanout_sink.devtools.topics import read_to_end
from fanout_sink.errors import FanoutSinkError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.protocol.channel import coordinator_group, sink_group

log = logging.getLogger("chaos")
STOP_TIMEOUT_S = 180.0  # SIGTERM finishes one batch and commits: minutes would mean it was ignored
# "BufferError: Local: Queue full", "fanout_sink.errors.OffsetGapError: gap in ...", not Spark's wrapper;
# or the CLI's one-line cause of an error it stopped with ("fanout-sink: control topic ... lost events").
_ERROR_LINE = re.compile(r"^((?!pyspark\.errors)[\w.]*(Error|Exception|Fault)\b.*:|fanout-sink: )")
# records/s: a trickle at least, so every cycle has work in flight to break; low enough that a slow
# machine does not produce all records before the last cycle (kinds that need a commit could not land).
MIN_RATE = 5.0
MAINTAIN_TIMEOUT_S = 600.0  # a JVM start and one maintenance run of every table on a loaded box
EXPIRY_TIMEOUT_S = 300.0  # offsets.retention.minutes=1 and a 5 s check: gone after about 65 s
REGISTRY_RUN_TIMEOUT_S = 600.0  # registry-lag: a JVM start, the retried batch and its commit
DRAIN_TIMEOUT_S = 300.0  # topic-recreate: the sink delivers the paused topic to its end
NOTICE_TIMEOUT_S = 120.0  # topic-recreate: Spark's next trigger sees the offsets go back and stops
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the source topics take the flood's oversized record
CONTROL_MESSAGE_BYTES = 128 * 1024
"""The control topic's ``max.message.bytes``: a slice of the wide table (300 columns, 16 buckets)
announces more files than fit one message, so its ``DataWritten`` events are packed by size."""
CREATE_TOPIC_ATTEMPTS = 3  # the run's topics; an attempt is one minute at most without an answer


class ChaosError(FanoutSinkError):
    """The run could not go on: the app stopped working (it logged no batch, or the final run failed).

    The run still counts what landed, so the verdict says what the stuck sink lost; ``cause`` is the
    one line for it: the last error the app logged.
    """

    def __init__(self, what: str, log_tail: str) -> None:
        errors = [line.strip() for line in log_tail.splitlines() if _ERROR_LINE.match(line.strip())]
        self.cause = f"{what}; its last error: {errors[-1] if errors else 'none logged'}"
        super().__init__(f"{self.cause}\n{log_tail}")


@dataclass(frozen=True)
class ChaosOptions:
    cycles: int = 5
    records: int = 20_000
    seed: int = 1
    kinds: tuple[str, ...] = kills.KINDS
    work_dir: Path | None = None
    max_delay_s: float = 6.0  # a breakage lands up to this long after the app's latest batch
    start_timeout_s: float = 300.0
    change_events: int = 0
    """Change traffic (``changes``): Debezium events beside the records; 0 turns it off."""


@dataclass
class ChaosResult:
    options: ChaosOptions
    verdict: Verdict
    kills: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    seconds: float = 0.0
    work_dir: Path = Path()

    def line(self) -> str:
        v = self.verdict
        kinds = " ".join(f"{kind}={self.kills[kind]}" for kind in self.options.kinds)
        skipped = f" (not landed: {dict(self.skipped)})" if self.skipped else ""
        change = (
            f" changes={v.changes} change-rows={v.change_rows}/{v.change_keys} keys: "
            f"missing={v.change_missing} extra={v.change_extra} wrong={v.change_wrong} "
            f"duplicate={v.change_duplicate_keys}"
            if self.options.change_events
            else ""
        )
        return (
            f"chaos verdict: {'PASS' if v.ok else 'FAIL'} seed={self.options.seed} "
            f"cycles={self.options.cycles} records={v.records} rows={v.rows} dead-lettered={v.dead_lettered} "
            f"filtered={v.filtered}{change} kills: {kinds}{skipped} restarts={self.restarts} "
            f"duplicates={v.duplicates} losses={v.losses} snapshots={v.snapshots} seconds={self.seconds:.0f}"
        )


class ChaosRun:
    def __init__(self, options: ChaosOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="fanout-sink-chaos-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.arm_dir = self.work_dir / "armed"
        self.arm_dir.mkdir(exist_ok=True)
        self.config_file = self.work_dir / "sink.yaml"
        self.name = f"chaos{options.seed}"
        expiry = "offset-expiry" in options.kinds
        self.broker = KafkaBroker(
            self.work_dir / "kafka", properties=kills.BROKER_PROPERTIES if expiry else None
        )
        self.catalog = CatalogSettings(
            name="chaos",
            type="sql",
            uri=f"sqlite:///{self.work_dir / 'catalog.db'}",
            warehouse=f"file://{self.work_dir / 'warehouse'}",
        )
        self.topics = [f"{self.name}-a", f"{self.name}-b"]
        # registry-lag: a registry-framed topic read by a sink of its own (registry_lag's docstring)
        self.registry: Registry | None = None
        self.registry_topic = f"{self.name}-avro"
        self.registry_config = self.work_dir / "sink-registry.yaml"
        self._registry_version = 0
        self._registry_undelivered = False
        self.changes: ChangeTraffic | None = (
            change_traffic(f"{self.name}-cdc", options.change_events, options.seed)
            if options.change_events
            else None
        )
        self.result = ChaosResult(options, Verdict(), work_dir=self.work_dir)
        self._catalog: Catalog | None = None
        self._serial = 0  # numbers table swaps and floods
        self._traffic: Traffic | None = None
        self.retired: list[Message] = []
        """The records of source topics deleted during the run (``topic-recreate``), read before."""
        self._breakers: dict[str, Callable[[AppProcess], bool]] = {
            "driver": self._kill_driver,
            "python-worker": self._kill_python_worker,
            "broker": self._restart_broker,
            "catalog-commit": self._fail_catalog_commit,
            "coordinator": self._kill_coordinator,
            "catalog-stall": self._stall_catalog,
            "offset-expiry": self._expire_offsets,
            "control-retention": self._delete_control_records,
            "snapshot-expiry": self._expire_snapshots,
            "partition-evolution": self._evolve_partition_spec,
            "table-recreate": self._recreate_table,
            "topic-recreate": self._recreate_topic,
            "dead-letter-flood": self._flood_dead_letters,
            "maintain": self._maintain,
            "registry-lag": self._lag_registry,
            "layout-change": self._change_layout,
        }

    def run(self) -> ChaosResult:
        """The whole run; the runner's own log goes to ``chaos.log`` in the work dir as well."""
        handler = logging.FileHandler(self.work_dir / "chaos.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        try:
            return self._run()
        finally:
            log.removeHandler(handler)
            handler.close()

    def _run(self) -> ChaosResult:
        started = time.monotonic()
        self.broker.start()
        app: AppProcess | None = None
        traffic: Traffic | None = None
        try:
            bootstrap = self.broker.bootstrap_servers
            self._create_topics(bootstrap)
            source_topics = self.topics
            if self.changes is not None:
                create_change_table(self.catalog_client, self.changes)
                source_topics = [*self.topics, self.changes.topic]
            config = self.config_file
            # A flood of thousands must overflow the producer queue as 100,000 would by default.
            kafka = (
                {"queue.buffering.max.messages": kills.FLOOD_QUEUE}
                if "dead-letter-flood" in self.options.kinds
                else {}
            )
            settings = scenario.sink_config(
                self.name,
                bootstrap,
                source_topics,
                self.catalog,
                self.work_dir,
                kafka,
                change_table=self.changes is not None,
                orphan_older_than=kills.CATALOG_STALL_ORPHAN_AGE
                if "catalog-stall" in self.options.kinds
                else None,
            )
            config.write_text(yaml.safe_dump(settings))
            if "registry-lag" in self.options.kinds:
                self.registry = Registry()
                self.registry_config.write_text(
                    yaml.safe_dump(
                        registry_lag.sink_config(
                            settings, self.registry_topic, self.registry.url, self.work_dir
                        )
                    )
                )
            command = [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(config)]
            env = child_env({"FANOUT_SINK_FAULTS": kills.fault_spec(self.arm_dir)})
            app = AppProcess([*command, "--trigger-interval", "1s"], self.work_dir / "app.log", env)
            # A first guess of the pace (about 40 s a cycle); each cycle corrects it from what it saw.
            pace = max(self.options.records / (self.options.cycles * 40.0), MIN_RATE)
            traffic = Traffic(
                bootstrap, self.topics, self.options.records, self.options.seed, pace, self.changes
            )
            traffic.start()
            self._traffic = traffic
            stuck: ChaosError | None = None
            try:
                stop_code = self._work(app, traffic, command, env)
            except ChaosError as error:
                log.error("the run stopped early; counting what landed: %s", error)
                stuck, stop_code = error, 0
                traffic.stop()
                app.kill_group()
            self.result.verdict = verify(
                bootstrap,
                self.topics,
                f"{self.name}-dlq",
                self.name,
                load_catalog(self.catalog),
                self.changes,
                self.retired,
            )
            if self.registry is not None:
                registry_lag.verify(
                    bootstrap,
                    self.registry_topic,
                    f"{self.name}-registry-dlq",
                    load_catalog(self.catalog),
                    self.result.verdict,
                )
            if stuck is not None:
                self.result.verdict.problems.insert(0, f"the run stopped early: {stuck.cause}")
            if stop_code != 0:
                self.result.verdict.problems.append(
                    f"SIGTERM did not stop the app cleanly within {STOP_TIMEOUT_S:.0f}s (exit {stop_code})"
                )
        finally:
            if traffic is not None:
                traffic.stop()
            if app is not None and app.running():
                app.kill_group()
            self.broker.stop()
            if self.registry is not None:
                self.registry.close()
        self.result.restarts = max(0, (app.starts if app else 1) - 1)
        self.result.seconds = time.monotonic() - started
        log.info("%s", self.result.line())
        (self.work_dir / "verdict.json").write_text(
            json.dumps({"line": self.result.line(), "problems": self.result.verdict.problems}, indent=2)
        )
        return self.result

    def _work(self, app: AppProcess, traffic: Traffic, command: list[str], env: dict[str, str]) -> int:
        """The cycles, the last records and the drain; the exit code of the app's SIGTERM stop."""
        self._cycles(app, traffic)
        log.info("cycles done; waiting for the producer to write its last records")
        while not traffic.done:
            self._keep_running(app)
            time.sleep(1)
        stats = traffic.finish()
        log.info("producer done: %d records acknowledged, %d failed", stats.acked, stats.failed)
        stop_code = self._drain(app, traffic, command, env)
        if self._registry_undelivered:  # a registry-lag cycle's run did not end cleanly: deliver the rest
            command = [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(self.registry_config)]
            final = AppProcess([*command, "--available-now"], self.work_dir / "registry.log", child_env())
            final.start()
            if final.wait_exit(REGISTRY_RUN_TIMEOUT_S) != 0:
                final.kill_group()
                raise ChaosError("the registry sink's final available-now run failed", final.log_tail())
        return stop_code

    def _create_topics(self, bootstrap: str) -> None:
        """Create the run's topics; an attempt that gets no answer is tried again with a new client.

        Once in a clean-clone CI run, a just-started broker answered no ``CreateTopics`` within 60 s
        (cause unknown: the broker log showed it ready and unfenced); the retry keeps the run going
        and the warning keeps the evidence in ``chaos.log``.
        """
        topics = [
            NewTopic(topic, partitions, 1, config={"max.message.bytes": str(MAX_MESSAGE_BYTES)})
            for topic, partitions in zip(self.topics, (3, 2), strict=True)
        ]
        if self.changes is not None:
            topics.append(NewTopic(self.changes.topic, changes.PARTITIONS, 1))
        if "registry-lag" in self.options.kinds:
            topics.append(NewTopic(self.registry_topic, 2, 1))
        control = {"max.message.bytes": str(CONTROL_MESSAGE_BYTES)}
        topics.append(NewTopic(f"{self.name}-control", 1, 1, config=control))
        for attempt in range(1, CREATE_TOPIC_ATTEMPTS + 1):
            admin = KafkaClientFactory({"bootstrap.servers": bootstrap}).admin()
            try:
                existing = admin.list_topics(timeout=30).topics
                missing = [topic for topic in topics if topic.topic not in existing]
                futures = admin.create_topics(missing, operation_timeout=30) if missing else {}
                for future in futures.values():
                    try:
                        future.result(timeout=60)
                    except KafkaException as exc:
                        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            raise
                return
            except (TimeoutError, KafkaException) as exc:
                if attempt == CREATE_TOPIC_ATTEMPTS:
                    raise
                log.warning(
                    "creating the topics got no answer (attempt %d: %r); trying again. Broker log:\n%s",
                    attempt, exc, log_tail(self.broker.log_file),
                )  # fmt: skip

    def _schedule(self) -> list[str]:
        """Every kind equally often, in a seeded order: a short run still breaks each thing once."""
        kinds: list[str] = []
        while len(kinds) < self.options.cycles:
            block = list(self.options.kinds)
            self.rng.shuffle(block)
            kinds.extend(block)
        return kinds[: self.options.cycles]

    def _keep_running(self, app: AppProcess) -> None:
        """The operator's restart: an app that is down is started again."""
        if app.running():
            return
        if app.exits:
            log.info("app exited with %s; restarting it", app.exits[-1])
        app.start()

    def _working(self, app: AppProcess, traffic: Traffic) -> None:
        """Wait until the app works: its query is up and, while records still arrive, it commits a
        batch (a breakage should land on a sink with work in flight)."""
        for _ in range(4):
            self._keep_running(app)
            if app.wait_working(self.options.start_timeout_s, batch=not traffic.done):
                return
            if app.running():
                break
        raise ChaosError(
            f"the app logged no batch in 4 starts (each died, or ran "
            f"{self.options.start_timeout_s:.0f}s without one)",
            app.log_tail(),
        )

    def _cycles(self, app: AppProcess, traffic: Traffic) -> None:
        schedule = self._schedule()
        cycle_started = time.monotonic()
        for cycle, kind in enumerate(schedule, 1):
            self._working(app, traffic)
            time.sleep(self.rng.uniform(0.0, self.options.max_delay_s))
            landed = self._break(app, kind)
            (self.result.kills if landed else self.result.skipped)[kind] += 1
            log.info("cycle %d/%d: %s %s", cycle, len(schedule), kind, "done" if landed else "did not land")
            self._keep_running(app)
            # Spread the remaining records over the remaining cycles at the pace seen so far.
            elapsed = (time.monotonic() - cycle_started) / cycle
            cycles_left = len(schedule) - cycle
            remaining = traffic.total - traffic.stats.attempted
            pace = remaining / max(cycles_left * elapsed, 1.0) if cycles_left else 5000.0
            traffic.rate = max(pace, MIN_RATE)

    def _break(self, app: AppProcess, kind: str) -> bool:
        """Break one thing; False when the breakage could not land (the cycle is counted as skipped)."""
        return self._breakers[kind](app)

    @property
    def catalog_client(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog(self.catalog)
        return self._catalog

    def _kill_driver(self, app: AppProcess) -> bool:
        app.kill_group()
        return True

    def _kill_python_worker(self, app: AppProcess) -> bool:
        assert app.pid is not None
        return kills.kill_busy_python_worker(app.pid) is not None

    def _restart_broker(self, _app: AppProcess) -> bool:
        self.broker.restart(away_s=self.rng.uniform(2.0, 8.0))
        return True

    def _fire(self, app: AppProcess, point: str) -> bool:
        """Arm a fault point and wait until the app passed it (False: it did not within 2 minutes)."""
        armed = kills.arm(self.arm_dir, point)
        deadline = time.monotonic() + 120
        while armed.exists() and app.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        fired = not armed.exists()
        armed.unlink(missing_ok=True)
        return fired

    def _fail_catalog_commit(self, app: AppProcess) -> bool:
        return self._fire(app, "catalog-commit")

    def _kill_coordinator(self, app: AppProcess, point: str | None = None) -> bool:
        """SIGKILL the driver at ``point``, by default one of ``kills.COORDINATOR_POINTS`` (seeded;
        the one after a change table's resolution only when there is change traffic)."""
        if point is None:
            changing = self.changes is not None
            points = [p for p in kills.COORDINATOR_POINTS if changing or p != "coordinator.after-resolve"]
            point = self.rng.choice(points)
        fired = self._fire(app, point)
        log.info("coordinator: armed at %s; the driver passed it and was killed: %s", point, fired)
        if fired:
            app.wait_exit(60)  # the kill of the driver process; the reap takes the group with it
        return fired

    def _stall_catalog(self, app: AppProcess) -> bool:
        """A worker's catalog load hangs ``kills.CATALOG_STALL_S`` after it wrote its files; once they
        are past the orphan age (and cleanup's margin), orphan cleanup runs on every sink table, then
        the cycle waits for the hang to end. Landed when the hang began and cleanup removed files."""
        if not self._fire(app, "catalog-stall"):
            return False
        stalled = time.monotonic()
        age = parse_duration(kills.CATALOG_STALL_ORPHAN_AGE).total_seconds()
        time.sleep(max(0.0, stalled + age * 1.1 + 1.0 - time.monotonic()))  # past the age and margin
        removed, _ = maintenance.remove_orphans(self.catalog_client, self.config_file, self._sink_tables())
        cleaned = time.monotonic() - stalled
        log.info(
            "catalog-stall: a catalog call hangs %.0fs; orphan cleanup %.0fs into it removed %d files",
            kills.CATALOG_STALL_S,
            cleaned,
            removed,
        )
        if cleaned >= kills.CATALOG_STALL_S:
            log.warning("catalog-stall: the cleanup ended after the hang: it did not run while it hung")
        time.sleep(max(0.0, stalled + kills.CATALOG_STALL_S - time.monotonic()))
        return removed > 0 and cleaned < kills.CATALOG_STALL_S

    def _expire_offsets(self, app: AppProcess) -> bool:
        """Stop the app (crash or clean, seeded) and keep it down until the broker expired the sink
        group's offsets; the caller's restart then finds none."""
        if self.rng.random() < 0.5:
            app.kill_group()
        else:
            app.stop(STOP_TIMEOUT_S)
        down = time.monotonic()
        expired = maintenance.group_expired(
            self.broker.bootstrap_servers, sink_group(self.name), self.topics, EXPIRY_TIMEOUT_S
        )
        log.info(
            "offset-expiry: the app stayed down %.0fs; sink group expired: %s",
            time.monotonic() - down,
            expired,
        )
        return expired

    def _delete_control_records(self, app: AppProcess) -> bool:
        start = maintenance.delete_control_records(
            self.broker.bootstrap_servers, coordinator_group(self.name), f"{self.name}-control"
        )
        if start is None:
            return False
        log.info("control-retention: the control topic now starts at %d; killing the driver", start)
        app.kill_group()
        return True

    def _expire_snapshots(self, app: AppProcess) -> bool:
        if not self._kill_coordinator(app, "coordinator.after-table-commit"):
            return False
        app.kill_group()  # make sure nothing of it still runs while the tables are changed
        name = maintenance.last_committed_table(self.catalog_client, scenario.NAMESPACES)
        if name is None:
            return False
        expired = maintenance.commit_as_other_writer_and_expire(self.catalog_client, name)
        log.info("snapshot-expiry: %s: another writer committed, %d snapshots expired", name, expired)
        return True

    def _evolve_partition_spec(self, _app: AppProcess) -> bool:
        tables = self._sink_tables()
        self.rng.shuffle(tables)
        for name in tables:  # the first table that still has a partition field to gain
            field_name = maintenance.evolve_partition_spec(self.catalog_client, name)
            if field_name is not None:
                log.info("partition-evolution: %s gained partition field %s", name, field_name)
                return True
        return False

    def _recreate_table(self, _app: AppProcess) -> bool:
        name = self.rng.choice([t for t in self._sink_tables() if t != changes.TABLE])  # see kills
        self._serial += 1
        aside = maintenance.swap_table(self.catalog_client, name, self._serial)
        log.info("table-recreate: %s renamed to %s and created again, empty", name, aside)
        return True

    def _recreate_topic(self, app: AppProcess) -> bool:
        """Pause traffic, let the sink deliver a source topic to its end, keep its records for the
        verdict, delete and recreate the topic, resume traffic into the new one. Not landed when the
        sink did not catch up in time (the topic stays). Spark's Kafka source stops the query when
        it sees the offsets go back (``failOnDataLoss``): the app's exit is waited for here, and the
        restart (the operator's) reads the new topic from its beginning."""
        assert self._traffic is not None
        bootstrap = self.broker.bootstrap_servers
        topic = self.rng.choice(self.topics)
        self._traffic.pause()
        try:
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while not maintenance.group_caught_up(bootstrap, sink_group(self.name), [topic], 10.0):
                self._keep_running(app)
                if time.monotonic() > deadline:
                    return False
            old = read_to_end(bootstrap, [topic])
            maintenance.recreate_topic(bootstrap, topic, {"max.message.bytes": str(MAX_MESSAGE_BYTES)})
            self.retired.extend(old)
        finally:
            self._traffic.resume()
        log.info("topic-recreate: %s deleted after delivering its %d records, created again", topic, len(old))
        code = app.wait_exit(NOTICE_TIMEOUT_S)
        log.info("topic-recreate: the app %s", "went on" if code is None else f"stopped with exit {code}")
        return True

    def _flood_dead_letters(self, _app: AppProcess) -> bool:
        self._serial += 1
        count = 3 * kills.FLOOD_QUEUE
        written = flood(
            self.broker.bootstrap_servers,
            self.topics[0],
            0,
            f"flood{self._serial}",
            count,
            kills.OVERSIZED_BYTES,
        )
        log.info(
            "dead-letter-flood: %d bad records (one of %d bytes) in %s[0]",
            written,
            kills.OVERSIZED_BYTES,
            self.topics[0],
        )
        return True

    def _maintain(self, _app: AppProcess) -> bool:
        """``fanout-sink maintain`` in its own process (its own JVM) while the app appends; landed
        when every step of every table succeeded. Its output goes to ``maintain.log``."""
        command = [sys.executable, "-m", "fanout_sink.cli", "maintain", "--config", str(self.config_file)]
        with (self.work_dir / "maintain.log").open("a") as output:
            code = subprocess.run(
                command,
                stdout=output,
                stderr=output,
                env=child_env(),
                timeout=MAINTAIN_TIMEOUT_S,
                check=False,
            ).returncode
        log.info("maintain: fanout-sink maintain exited %d (its output is in maintain.log)", code)
        return code == 0

    def _lag_registry(self, _app: AppProcess) -> bool:
        """Register a new writer schema whose id the registry hides, write ``registry_lag.RECORDS``
        records with it, and start the registry topic's sink (``--available-now``, a second process);
        the id is served ``registry_lag.LAG_S`` after a worker first asked for it. Landed when a worker
        asked while it was hidden and the run ended cleanly (every record delivered)."""
        assert self.registry is not None
        self._registry_version += 1
        schema_id = registry_lag.produce(
            self.broker.bootstrap_servers,
            self.registry_topic,
            self.registry,
            self._registry_version,
            registry_lag.RECORDS,
        )
        command = [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(self.registry_config)]
        run = AppProcess([*command, "--available-now"], self.work_dir / "registry.log", child_env())
        run.start()
        in_topic = time.monotonic()
        deadline = in_topic + REGISTRY_RUN_TIMEOUT_S
        while (
            not registry_lag.asked(self.registry, schema_id) and run.running() and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        asked = registry_lag.asked(self.registry, schema_id)
        if asked:
            time.sleep(registry_lag.LAG_S)
        self.registry.reveal(schema_id)
        lag = time.monotonic() - in_topic
        code = run.wait_exit(max(deadline - time.monotonic(), 1.0))
        if code is None:
            run.kill_group()
        self._registry_undelivered |= code != 0
        log.info(
            "registry-lag: schema id %d served %.0fs after its %d records were in the topic (asked while "
            "unknown: %s); the registry sink's run ended with %s (its log: registry.log)",
            schema_id, lag, registry_lag.RECORDS, asked, code,
        )  # fmt: skip
        return asked and code == 0

    def _change_layout(self, app: AppProcess) -> bool:
        """A second app with another partition-group count starts while a worker of the first holds
        its transaction open (``layout_change``). Landed when the second recorded its start, the
        first then stopped by itself and the second delivered a batch. The second is stopped after
        (its output is in ``layout-change.log``); the caller's restart brings the first count back."""
        release = self.arm_dir / layout_change.RELEASE
        release.unlink(missing_ok=True)
        before = layout_change.recorded_start(self.config_file)
        if not self._fire(app, "layout-change"):
            release.touch()
            return False
        command = layout_change.second_app(app.command)
        second = AppProcess(command, self.work_dir / "layout-change.log", child_env())
        second.start()
        recorded = exited = delivered = False
        try:
            timeout_s = self.options.start_timeout_s
            recorded = layout_change.wait_recorded(self.config_file, before, timeout_s, second.running)
            release.touch()  # the held worker's commit now meets the second start's fence
            exited = recorded and app.wait_exit(layout_change.SUPERSEDED_TIMEOUT_S) is not None
            delivered = exited and second.wait_working(
                timeout_s, batch=not (self._traffic and self._traffic.done)
            )
        finally:
            release.touch()
            code = second.stop(STOP_TIMEOUT_S) if second.running() else second.wait_exit(10)
        if app.running():  # not superseded in time: the cycle did not land
            app.stop(STOP_TIMEOUT_S)
        log.info(
            "layout-change: second app with %d partition groups recorded its start: %s; the first app "
            "stopped by itself: %s (said superseded: %s); the second delivered a batch: %s, stopped with %s",
            layout_change.OTHER_GROUPS, recorded, exited, layout_change.said_superseded(app.log_file),
            delivered, code,
        )  # fmt: skip
        return recorded and exited and delivered

    def _sink_tables(self) -> list[str]:
        """The tables the sink writes now (never the ones a swap renamed aside)."""
        return sorted(
            ".".join(identifier)
            for namespace in scenario.NAMESPACES
            for identifier in self.catalog_client.list_tables(namespace)
            if maintenance.ASIDE_INFIX not in identifier[-1]
        )

    def _drain(self, app: AppProcess, traffic: Traffic, command: list[str], env: dict[str, str]) -> int:
        """Stop as an operator would (SIGTERM; its exit code is returned), then one available-now run
        delivers the rest."""
        self._working(app, traffic)
        stop_code = app.stop(STOP_TIMEOUT_S)
        log.info("app stopped with exit code %d", stop_code)
        final = AppProcess([*command, "--available-now"], self.work_dir / "app.log", env)
        final.start()
        code = final.wait_exit(900)
        if code != 0:
            final.kill_group()
            raise ChaosError(f"the final available-now run ended with {code}", final.log_tail())
        return stop_code
