"""How tests run the real app: a sink's topics and YAML, its produced ids, ``fanout-sink run`` in a child.

The default sink routes the sample shop events (fanout_sink.devtools.sample_data) to static tables by type and
to dynamic ``raw.<type>`` tables; ``overrides`` replaces top-level sections of its YAML.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer

from fanout_sink.catalog import CatalogSettings, load_catalog
from fanout_sink.devtools.chaos.app_process import child_env
from fanout_sink.devtools.sample_data import shop_events

STATIC = {"shop.orders": "order", "shop.payments": "payment", "shop.clicks": "click"}
DYNAMIC = {"raw.order": "order", "raw.payment": "payment", "raw.click": "click"}


class SinkRun:
    """One sink under test: its topics, config file, produced ids and how to run the app."""

    def __init__(
        self,
        tmp_path: Path,
        bootstrap: str,
        settings: CatalogSettings,
        make_topic: Callable[..., str],
        topics: dict[str, str] | None = None,
        commit_interval: str = "2s",
        overrides: dict[str, Any] | None = None,
    ):
        self.tmp_path = tmp_path
        self.bootstrap = bootstrap
        self.settings = settings
        self.name = f"sink-{uuid.uuid4().hex[:6]}"
        self.topics = topics or {
            "orders": make_topic("orders", partitions=3),
            "clicks": make_topic("clicks", partitions=2),
        }
        self.expected: dict[str, set[Any]] = {}
        """Ids each table must hold, exactly."""
        self.produced = 0
        self.config = tmp_path / "sink.yaml"
        sink: dict[str, Any] = {
            "name": self.name,
            "kafka": {"bootstrap.servers": bootstrap},
            "source": {"topics": sorted(self.topics.values()), "format": "json"},
            "control": {"topic": f"{self.name}-control", "commit-interval": commit_interval},
            "catalog": settings.model_dump(),
            "tables": {table: {"when": f"type == '{kind}'"} for table, kind in STATIC.items()},
            "dynamic": {
                "table": "join('.', ['raw', type])",
                "allow": "^raw\\.[a-z]+$",
                "auto-create": True,
                "applies-to": "all",
            },
            "spark": {"checkpoint-location": str(tmp_path / "checkpoints"), "master": "local[2]"},
        }
        sink.update(overrides or {})
        self.config.write_text(yaml.safe_dump(sink))

    def produce(self, count: int) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"{self.name}-source"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for event in shop_events(count, start=self.produced):
            producer.produce(self.topics[event.topic], key=event.key, value=event.value)
            kind = event.key.decode().split("-")[0]
            for table, wanted in {**STATIC, **DYNAMIC}.items():
                if wanted == kind:
                    self.expected.setdefault(table, set()).add(event.key.decode())
            producer.poll(0)
        producer.commit_transaction(60)
        self.produced += count

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "fanout_sink.cli", "run", "--config", str(self.config), *args]

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
        catalog = load_catalog(self.settings)
        return {
            table: sorted(
                catalog.load_table(table).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
            )
            for table in self.expected
        }

    def assert_exact(self) -> None:
        got = self.table_ids()
        for table, ids in self.expected.items():
            duplicates = len(got[table]) - len(set(got[table]))
            assert duplicates == 0, f"{table}: {duplicates} duplicate rows"
            assert set(got[table]) == ids, f"{table}: missing {len(ids - set(got[table]))}"
