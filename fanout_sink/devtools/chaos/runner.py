"""One chaos run: set up, cycle through breakages while traffic flows, drain, verify, one verdict line."""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.chaos import kills, scenario
from fanout_sink.devtools.chaos.app_process import AppProcess, child_env
from fanout_sink.devtools.chaos.traffic import Traffic
from fanout_sink.devtools.chaos.verify import Verdict, verify
from fanout_sink.devtools.stack.broker import KafkaBroker
from fanout_sink.errors import FanoutSinkError

log = logging.getLogger("fanout_sink.devtools.chaos")
STOP_TIMEOUT_S = 180.0  # SIGTERM finishes one batch and commits: minutes would mean it was ignored
MIN_RATE = 20.0  # records/s: a trickle at least, so every cycle has work in flight to break


class ChaosError(FanoutSinkError):
    """The run could not go on (the app never got to work); the verdict would mean nothing."""


@dataclass(frozen=True)
class ChaosOptions:
    cycles: int = 5
    records: int = 20_000
    seed: int = 1
    kinds: tuple[str, ...] = kills.KINDS
    work_dir: Path | None = None
    max_delay_s: float = 6.0  # a breakage lands up to this long after the app's latest batch
    start_timeout_s: float = 300.0


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
        return (
            f"chaos verdict: {'PASS' if v.ok else 'FAIL'} seed={self.options.seed} "
            f"cycles={self.options.cycles} records={v.records} rows={v.rows} dead-lettered={v.dead_lettered} "
            f"filtered={v.filtered} kills: {kinds}{skipped} restarts={self.restarts} "
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
        self.name = f"chaos{options.seed}"
        self.broker = KafkaBroker(self.work_dir / "kafka")
        self.catalog = CatalogSettings(
            name="chaos",
            type="sql",
            uri=f"sqlite:///{self.work_dir / 'catalog.db'}",
            warehouse=f"file://{self.work_dir / 'warehouse'}",
        )
        self.topics = [f"{self.name}-a", f"{self.name}-b"]
        self.result = ChaosResult(options, Verdict(), work_dir=self.work_dir)

    def run(self) -> ChaosResult:
        started = time.monotonic()
        self.broker.start()
        app: AppProcess | None = None
        traffic: Traffic | None = None
        try:
            bootstrap = self.broker.bootstrap_servers
            self._create_topics(bootstrap)
            config = self.work_dir / "sink.yaml"
            config.write_text(
                yaml.safe_dump(
                    scenario.sink_config(self.name, bootstrap, self.topics, self.catalog, self.work_dir)
                )
            )
            command = [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(config)]
            env = child_env({"FANOUT_SINK_FAULTS": kills.fault_spec(self.arm_dir)})
            app = AppProcess([*command, "--trigger-interval", "1s"], self.work_dir / "app.log", env)
            # A first guess of the pace (about 40 s a cycle); each cycle corrects it from what it saw.
            pace = max(self.options.records / (self.options.cycles * 40.0), MIN_RATE)
            traffic = Traffic(bootstrap, self.topics, self.options.records, self.options.seed, rate=pace)
            traffic.start()
            self._cycles(app, traffic)
            log.info("cycles done; waiting for the producer to write its last records")
            while not traffic.done:
                self._keep_running(app)
                time.sleep(1)
            stats = traffic.finish()
            log.info("producer done: %d records acknowledged, %d failed", stats.acked, stats.failed)
            stop_code = self._drain(app, traffic, command, env)
            self.result.verdict = verify(
                bootstrap, self.topics, f"{self.name}-dlq", self.name, load_catalog(self.catalog)
            )
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
        self.result.restarts = max(0, (app.starts if app else 1) - 1)
        self.result.seconds = time.monotonic() - started
        (self.work_dir / "verdict.json").write_text(
            json.dumps({"line": self.result.line(), "problems": self.result.verdict.problems}, indent=2)
        )
        return self.result

    def _create_topics(self, bootstrap: str) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics(
            [NewTopic(self.topics[0], 3, 1), NewTopic(self.topics[1], 2, 1)], operation_timeout=30
        )
        for future in futures.values():
            future.result(timeout=60)

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
        raise ChaosError(f"the app logged no batch in {self.options.start_timeout_s:.0f}s:\n{app.log_tail()}")

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
        if kind == "driver":
            app.kill_group()
            return True
        if kind == "python-worker":
            assert app.pid is not None
            return kills.kill_busy_python_worker(app.pid) is not None
        if kind == "broker":
            self.broker.restart(away_s=self.rng.uniform(2.0, 8.0))
            return True
        armed = kills.arm(self.arm_dir, kind)
        deadline = time.monotonic() + 120
        while armed.exists() and app.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        fired = not armed.exists()
        armed.unlink(missing_ok=True)
        if kind == "coordinator" and fired:
            app.wait_exit(60)  # the kill of the driver process; the reap takes the group with it
        return fired

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
            raise ChaosError(f"the final available-now run ended with {code}:\n{final.log_tail()}")
        return stop_code
