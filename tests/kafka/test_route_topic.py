"""``fanout-sink route --topic T --last N`` on a real broker: each partition's last N offsets are
previewed, and no group gets an offset or a member (the sink's first run starts where it would)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from support.common import produce_json, sink_group_offset

from fanout_sink import cli
from fanout_sink.catalog import CatalogSettings
from fanout_sink.protocol.channel import sink_group


def test_route_reads_the_last_offsets_of_each_partition_and_commits_nothing(
    tmp_path: Path,
    bootstrap_servers: str,
    make_topic: Callable[..., str],
    catalog_settings: CatalogSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = make_topic("route", partitions=2)
    produce_json(bootstrap_servers, topic, 0, [{"kind": "order", "id": i} for i in range(5)])
    produce_json(bootstrap_servers, topic, 1, [{"kind": "other", "id": 10 + i} for i in range(2)])
    name = f"route-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "sink.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "kafka": {"bootstrap.servers": bootstrap_servers},
                "source": {"topics": [topic]},
                "catalog": catalog_settings.model_dump(exclude_none=True),
                "tables": {"shop.orders": {"when": "kind == 'order'"}},
            }
        )
    )
    code = cli.main(["route", "--config", str(config), "--topic", topic, "--last", "3", "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    assert code == 0
    seen = [(r["partition"], r["offset"]) for r in found["records"]]
    assert seen == [(0, 2), (0, 3), (0, 4), (1, 0), (1, 1)]
    assert [r["outcomes"][0]["row"]["id"] for r in found["records"][:3]] == [2, 3, 4]
    assert {r["outcomes"][0]["reason"] for r in found["records"][3:]} == {
        "no table matched the record (unmatched.action is drop)"
    }
    # Nothing committed: the sink group has no offset, and no group of the sink exists on the broker.
    assert sink_group_offset(bootstrap_servers, name, topic, 0) is None
    assert sink_group_offset(bootstrap_servers, name, topic, 1) is None
    groups = AdminClient({"bootstrap.servers": bootstrap_servers}).list_consumer_groups().result(30)
    assert not [g.group_id for g in groups.valid if name in g.group_id], sink_group(name)
