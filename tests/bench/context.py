"""What every system of the side-by-side benchmark gets for one run, and what it hands back.

Each run has a folder of its own with a fresh SQLite SQL catalog and warehouse, created with the
variant's tables before the system starts; the topic is the same for every system and round.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fanout_sink
from bench.landed import TableLanding, VisibleRows
from bench.proctree import ChildRun
from bench.workload import Variant, create_tables
from fanout_sink.catalog import CatalogSettings, load_catalog

CATALOG_NAME = "bench"
PARTITIONS = 2


def catalog_settings(folder: Path) -> CatalogSettings:
    """The catalog of the run in ``folder`` (also for reading a kept run folder afterwards)."""
    return CatalogSettings(
        name=CATALOG_NAME,
        uri=f"sqlite:///{folder / 'catalog.db'}",
        warehouse=f"file://{folder / 'warehouse'}",
    )


def child_env() -> dict[str, str]:
    """The environment of a measured child: this checkout's code first, no inherited Spark gateway.

    ``tests/`` is on its path too: the benchmarks are the package ``bench`` there, which a child run as
    ``python -m bench.<name>`` imports, and so do the Spark Python workers it starts (they inherit its
    environment) when they unpickle :mod:`bench.range_source`'s data source."""
    root = str(Path(fanout_sink.__file__).resolve().parents[1])
    tools = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, tools, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True)
class RunContext:
    """One system's run: the shared input and a fresh catalog under ``folder``."""

    bootstrap: str
    topic: str
    variant: Variant
    records: int
    values_file: Path
    commit_interval_s: float
    cores: int
    max_offsets_per_trigger: int | None
    """``--max-offsets-per-trigger`` of the sink's run; None: unset (the sink's default)."""
    folder: Path
    taskset: str | None = None
    maintenance: dict[str, str] | None = None
    """The sink YAML's ``maintenance`` section (soak and latency modes' ``--maintenance``)."""
    spark: dict[str, str] | None = None
    """Keys added to the sink YAML's ``spark`` section (``--spark``: an A/B of a setting)."""
    connect_heap: str = "2g"
    """The Kafka Connect peer's ``-Xmx`` (the notes' setup: 2g)."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def unique_name(self, system: str) -> str:
        """A name for this run's sink, connector, control topic and groups: never one of an earlier
        run, whose control topic and committed offsets would make this run skip the records."""
        return re.sub(r"[^A-Za-z0-9-]+", "-", f"{system}-{self.folder.name}-{self.run_id}")

    @property
    def timeout_s(self) -> float:
        """How long a system may take before the run is called stuck: 10 minutes plus 1 ms per
        record (1,000 records/s, far below every system's pace), so 10M records get 3 hours."""
        return 600.0 + self.records / 1000.0

    @property
    def master(self) -> str:
        return f"local[{self.cores}]"

    @property
    def catalog_db(self) -> Path:
        return self.folder / "catalog.db"

    @property
    def settings(self) -> CatalogSettings:
        return catalog_settings(self.folder)

    def prepare(self) -> Any:
        """Create the folder (emptied when a reused ``--work-dir`` holds it) and the variant's tables in
        a fresh catalog; returns the catalog."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        catalog = load_catalog(self.settings)
        create_tables(catalog, self.variant)
        return catalog

    def visible(self) -> VisibleRows:
        return VisibleRows(self.catalog_db, CATALOG_NAME)

    def child_env(self) -> dict[str, str]:
        return child_env()


@dataclass(frozen=True)
class SystemRun:
    """What one system did in one round: its own measures and what it landed."""

    system: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    worker_rss_mb: float | None
    steady_s: float | None
    landing: dict[str, TableLanding]
    pss_mb: float | None = None
    role_rss_mb: dict[str, float] = field(default_factory=dict)
    role_processes: dict[str, int] = field(default_factory=dict)
    role_cpu_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of_child(
        cls,
        system: str,
        child: ChildRun,
        landing: dict[str, TableLanding],
        *,
        wall_s: float | None = None,
        steady_s: float | None = None,
    ) -> SystemRun:
        """The measures of a system run as one child process tree; ``wall_s`` when the system times
        its own work (then start-up is left out). No Python workers seen: no worker RSS."""
        return cls(
            system=system,
            wall_s=child.wall_s if wall_s is None else wall_s,
            cpu_s=child.cpu_s,
            peak_rss_mb=child.peak_rss_mb,
            worker_rss_mb=child.peak_worker_rss_mb or None,
            steady_s=steady_s,
            landing=landing,
            pss_mb=child.peak_pss_mb or None,
            role_rss_mb=child.role_rss_mb,
            role_processes=child.role_processes,
            role_cpu_s=child.role_cpu_s,
        )
