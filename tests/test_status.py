"""``fanout-sink status`` reads tables' summaries and the sink group, on the real broker and catalog."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.common import create_tables, make_processor, produce_json, run_batch

from fanout_sink.catalog import CatalogSettings
from fanout_sink.cli import main
from fanout_sink.protocol.coordinator import Coordinator
from fanout_sink.protocol.worker import SliceWorker

pytestmark = pytest.mark.kafka


def test_status_shows_table_commits_and_source_lag(
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog: Any,
    catalog_settings: CatalogSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = f"st{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": bootstrap_servers}
    topic = make_topic("src", partitions=2)
    create_tables(catalog, ["a", "b"])
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    produce_json(bootstrap_servers, topic, 1, [{"id": i, "table": "b"} for i in range(4, 7)])
    worker = SliceWorker(sink, conf, f"{sink}-control")
    run_batch(worker, bootstrap_servers, {topic: 2}, make_processor(catalog))
    worker.close()
    coordinator = Coordinator(sink, conf, f"{sink}-control", catalog, source_topics=[topic])
    coordinator.open()
    result = coordinator.commit_round()
    coordinator.close()
    produce_json(bootstrap_servers, topic, 1, [{"id": 99, "table": "b"}])  # not delivered yet: lag 1

    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": sink,
                "kafka": conf,
                "source": {"topics": [topic], "format": "json"},
                "control": {"topic": f"{sink}-control", "commit-interval": "30s"},
                "catalog": catalog_settings.model_dump(),
                "tables": {"sink.a": {"when": "table == 'a'"}},  # ignored by status
            }
        )
    )
    assert main(["status", "--config", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [t["table"] for t in status["tables"]] == ["sink.a", "sink.b"]
    assert {t["commit_id"] for t in status["tables"]} == {result.commit_id}
    assert all(t["vtts_ms"] == result.vtts_ms and t["snapshot_id"] for t in status["tables"])
    assert status["tables"][0]["control_offsets"] == {"0": result.round_end}
    lags = {(p["topic"], p["partition"]): (p["committed"], p["end"], p["lag"]) for p in status["partitions"]}
    assert lags == {(topic, 0): (4, 4, 0), (topic, 1): (3, 4, 1)}

    assert main(["status", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert f"sink.a: commit {result.commit_id}" in text and f"{topic}[1]: committed 3 end 4 lag 1" in text
