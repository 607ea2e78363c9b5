"""``fanout-sink status`` reads tables' summaries and the sink group, on the real broker and catalog;
its ``--json`` keys are exactly the ones ``docs/status.md`` documents."""

from __future__ import annotations

import dataclasses
import gc
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from support.common import make_processor, produce_json, run_planned_batch
from support.sink_factory import SinkFactory

from fanout_sink import status as status_command
from fanout_sink.cli import main
from fanout_sink.protocol import group_layout, round_trigger, table_state
from fanout_sink.protocol.channel import SinkChannel, ensure_control_topic
from fanout_sink.protocol.partition_groups import PartitionGroups
from fanout_sink.protocol.table_cadence import CommitIntervals, phase_ms
from fanout_sink.transform.processor import build_processor

DOC = Path(__file__).resolve().parents[1] / "docs" / "status.md"


def documented_keys() -> dict[str, set[str]]:
    """The keys each section of docs/status.md lists: ``top``, ``tables``, ``pending``, ``partitions``."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## (?:Top level|`(\w+)\[\]`)$", line)
        if heading:
            current = heading.group(1) or "top"
            sections[current] = set()
        elif line.startswith("## "):
            current = None
        elif current is not None and (row := re.match(r"\| `(\w+)` \|", line)):
            sections[current].add(row.group(1))
    return sections


def test_status_shows_table_commits_and_source_lag(
    bootstrap_servers: str, sink_factory: SinkFactory, catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = sink_factory(partitions={"src": 2}, tables="ab", prefix="st")
    topic = sink.topic
    produce_json(bootstrap_servers, topic, 0, [{"id": i, "table": "a"} for i in range(4)])
    produce_json(bootstrap_servers, topic, 1, [{"id": i, "table": "b"} for i in range(4, 7)])
    sink.batch()
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    produce_json(bootstrap_servers, topic, 1, [{"id": 99, "table": "b"}])  # not delivered yet: lag 1
    produce_json(bootstrap_servers, topic, 0, [{"id": 98, "table": "a"}])  # delivered, not committed
    pending_worker = sink.worker()
    run_planned_batch(pending_worker, bootstrap_servers, {(topic, 0): (4, 5)}, make_processor(catalog))
    pending_worker.close()
    maintained_ms = int(time.time() * 1000) - 60_000
    with catalog.load_table("sink.b").transaction() as txn:
        txn.set_properties({table_state.MAINTENANCE_LAST_RUN_MS: str(maintained_ms)})

    config = sink.config_file
    assert main(["status", "--config", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["source_pattern"], status["source_topics"]) == (None, [topic])
    assert [t["table"] for t in status["tables"]] == ["sink.a", "sink.b"]
    assert {t["commit_id"] for t in status["tables"]} == {result.commit_id}
    assert all(t["vtts_ms"] == result.vtts_ms and t["snapshot_id"] for t in status["tables"])
    assert status["tables"][0]["control_offsets"] == {"0": result.round_end}
    for table in status["tables"]:
        expected_age = (status["collected_at_ms"] - result.vtts_ms) / 1000
        assert table["vtts_age_s"] == pytest.approx(expected_age) and table["vtts_age_s"] >= 0
        # One slice wrote one file per table; the pending file of sink.a is not counted.
        assert (table["data_files"], table["snapshots"]) == (1, 1)
        assert table["data_bytes"] > 0 and table["average_file_bytes"] == table["data_bytes"]
    assert [t["last_maintenance_ms"] for t in status["tables"]] == [None, maintained_ms]
    assert [(p["table"], p["file_events"]) for p in status["pending"]] == [("sink.a", 1)]
    lags = {(p["topic"], p["partition"]): (p["committed"], p["end"], p["lag"]) for p in status["partitions"]}
    assert lags == {(topic, 0): (5, 5, 0), (topic, 1): (3, 4, 1)}

    documented = documented_keys()
    assert set(status) == documented["top"]
    for section in ("tables", "pending", "partitions"):
        assert status[section] and all(set(item) == documented[section] for item in status[section]), section

    assert main(["status", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert f"sink.a: commit {result.commit_id}" in text and f"{topic}[1]: committed 3 end 4 lag 1" in text
    assert "1 data files, average" in text and "last maintenance never" in text
    assert "s ago)" in text and "sink.a: 1 file event(s)" in text


def test_status_shows_each_tables_cadence_and_when_its_waiting_files_are_due(
    bootstrap_servers: str, sink_factory: SinkFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per-table cadence (issue 50 item 2): sink.b commits every 10 minutes, sink.a every round; its
    files waiting are due at the end of the 10-minute period their oldest was written in."""
    sink = sink_factory(partitions={"src": 1}, tables="ab", prefix="st")
    data = yaml.safe_load(sink.config_file.read_text())
    data["tables"]["sink.b"]["commit-interval"] = "10m"
    sink.config_file.write_text(yaml.safe_dump(data))
    coordinator = sink.coordinator(commit_intervals=CommitIntervals.of(sink.config))
    produce_json(bootstrap_servers, sink.topic, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(4)])
    sink.batch()
    coordinator.commit_round(round_trigger.STOP)  # both commit once
    produce_json(bootstrap_servers, sink.topic, 0, [{"id": i, "table": "ab"[i % 2]} for i in range(4, 8)])
    sink.batch()
    waiting = coordinator.commit_round()
    coordinator.close()
    assert set(waiting.tables) == {"sink.a"} and waiting.waiting == {"sink.b"}

    assert main(["status", "--config", str(sink.config_file), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    cadence = {t["table"]: (t["commit_interval_s"], t["next_commit_due_ms"]) for t in status["tables"]}
    (pending,) = status["pending"]
    phase = phase_ms("sink.b", 600.0)  # sink.b's periods begin this far past the epoch's
    due = ((pending["oldest_written_ms"] - phase) // 600_000 + 1) * 600_000 + phase
    assert cadence == {"sink.a": (None, None), "sink.b": (600.0, due)}
    assert (pending["table"], pending["commit_interval_s"], pending["commit_due_ms"]) == (
        "sink.b",
        600.0,
        due,
    )
    assert main(["status", "--config", str(sink.config_file)]) == 0
    text = capsys.readouterr().out
    assert "last maintenance never, commits every round" in text
    assert "commits every 10.0 min, waiting files due " in text and "sink.b: 1 file event(s)" in text


def test_status_counts_a_change_tables_delete_files(
    bootstrap_servers: str, sink_factory: SinkFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    route = {
        "when": "table == 'a'",
        "select": "{id: id, v: v}",
        "changes": {"format": "upsert", "key": ["id"]},
    }
    sink = sink_factory(partitions={"src": 1}, prefix="std", overrides={"tables": {"sink.a": route}})
    process = build_processor(sink.config, sink.catalog)
    coordinator = sink.coordinator()
    for version in range(3):  # the second and third rounds update keys 0-4: position deletes
        produce_json(
            bootstrap_servers, sink.topic, 0, [{"table": "a", "id": i, "v": version} for i in range(5)]
        )
        sink.batch(process=process)
        coordinator.commit_round()
    coordinator.close()
    listed = sink.catalog.load_table("sink.a").inspect.delete_files()

    assert main(["status", "--config", str(sink.config_file), "--json"]) == 0
    (table,) = json.loads(capsys.readouterr().out)["tables"]
    assert (table["delete_files"], table["position_deletes"]) == (listed.num_rows, 10)
    assert table["delete_files"] >= 2 and table["data_files"] == 3
    assert main(["status", "--config", str(sink.config_file)]) == 0
    assert f"{listed.num_rows} delete files (10 rows)" in capsys.readouterr().out


def test_status_of_a_pattern_source_shows_the_topics_it_matches_now(
    bootstrap_servers: str, sink_factory: SinkFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    topics = {f"{prefix}.a": 2, f"{prefix}.b": 1, f"{prefix}.ab": 1, f"x{prefix}.a": 1}
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        future.result(timeout=30)
    produce_json(bootstrap_servers, f"{prefix}.a", 0, [{"id": 1, "table": "a"}, {"id": 2, "table": "a"}])
    produce_json(bootstrap_servers, f"{prefix}.b", 0, [{"id": 3, "table": "a"}])
    produce_json(bootstrap_servers, f"{prefix}.ab", 0, [{"id": 4, "table": "a"}])
    # Spark's subscribePattern matches whole names: .ab and x<prefix>.a are not subscribed.
    pattern = prefix + r"\.[ab]"
    config = sink_factory(topics={}, prefix="sp", source={"pattern": pattern}).config_file

    assert main(["status", "--config", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["source_pattern"] == pattern
    assert status["source_topics"] == [f"{prefix}.a", f"{prefix}.b"]
    lags = {(p["topic"], p["partition"]): (p["committed"], p["end"], p["lag"]) for p in status["partitions"]}
    assert lags == {
        (f"{prefix}.a", 0): (None, 2, 2),
        (f"{prefix}.a", 1): (None, 0, 0),
        (f"{prefix}.b", 0): (None, 1, 1),
    }
    assert status["tables"] == [] and status["pending"] == []

    assert main(["status", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert f"pattern {pattern} matches 2 topics now" in text
    assert text.count(f"{prefix}.b") == 1, "each matched topic named once, with its partitions"
    assert f"{prefix}.a[0]: committed - end 2 lag 2" in text and f"{prefix}.ab[" not in text


def test_status_uses_the_partition_group_layout_the_apps_start_recorded(
    sink_factory: SinkFactory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status`` (like maintenance and ``import-connect``: ``group_layout.channel_in_use``) names the
    transactional ids the app's workers use: the layout its start recorded, not one of its own."""
    sink = sink_factory(partitions={"src": 4}, prefix="stl")
    ensure_control_topic(sink.channel)
    seen: list[SinkChannel] = []
    collect = status_command.collect_status

    def spy(channel: SinkChannel, *args: Any) -> Any:
        seen.append(channel)
        return collect(channel, *args)

    monkeypatch.setattr(status_command, "collect_status", spy)
    assert main(["status", "--config", str(sink.config_file), "--json"]) == 0
    app = dataclasses.replace(
        sink.channel, partition_groups=PartitionGroups(3)
    )  # the app's decision at start
    group_layout.fence_other_layouts(app, [(sink.topic, p) for p in range(4)])
    assert main(["status", "--config", str(sink.config_file), "--json"]) == 0
    capsys.readouterr()

    assert [channel.partition_groups for channel in seen] == [PartitionGroups(), PartitionGroups(3)]
    assert seen[1] == app == group_layout.channel_in_use(sink.config)
    assert seen[1].worker_transactional_id(sink.topic, 0) == app.worker_transactional_id(sink.topic, 0)


def _changed(config_file: Path, folder: Path, **sections: Any) -> Path:
    """A copy of a sink YAML with ``sections`` replaced: a broker or a catalog that is down."""
    data = yaml.safe_load(config_file.read_text())
    path = folder / "down.yaml"
    path.write_text(yaml.safe_dump({**data, **sections}))
    return path


BROKER_DOWN = {"bootstrap.servers": "127.0.0.1:1"}
"""A closed port: refused at once, as a broker that is down."""


def test_status_with_the_broker_down_still_shows_the_tables_and_names_the_broker_in_one_line(
    bootstrap_servers: str, sink_factory: SinkFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``status`` is run when something is wrong: with the broker down it printed a traceback after
    31 s and nothing of the tables (issue 49). Now one line says what is unreachable and what to
    check, the tables are shown without lag, and exit 3 says which half is missing."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="sbd")
    produce_json(bootstrap_servers, sink.topic, 0, [{"id": 1, "table": "a"}])
    sink.batch()
    coordinator = sink.coordinator()
    result = coordinator.commit_round()
    coordinator.close()
    config = _changed(sink.config_file, tmp_path, kafka=BROKER_DOWN)
    gc.collect()  # the set-up's own Kafka clients say their last words to stderr when collected
    capfd.readouterr()

    assert main(["status", "--config", str(config)]) == 3
    out, err = capfd.readouterr()
    assert f"sink.a: commit {result.commit_id}" in out
    assert "source partitions:\n  (not read: see the Kafka line above)" in out
    assert "Traceback" not in out + err
    [line] = err.strip().splitlines()
    assert line.startswith(
        'fanout-sink status: Kafka at kafka."bootstrap.servers"=127.0.0.1:1 is unreachable'
    ), line
    assert "(lag not shown)" in line and "; fix: " in line

    assert main(["status", "--config", str(config), "--json"]) == 3
    out, err = capfd.readouterr()
    status = json.loads(out)
    assert [t["table"] for t in status["tables"]] == ["sink.a"] and status["partitions"] == []
    assert [fault["part"] for fault in status["faults"]] == ["kafka"]
    assert set(status["faults"][0]) == documented_keys()["faults"]
    assert len(err.strip().splitlines()) == 1


def test_status_with_the_catalog_down_still_shows_the_lag_and_names_the_catalog_in_one_line(
    bootstrap_servers: str, sink_factory: SinkFactory, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A REST catalog that is down printed 106 lines of traceback (issue 49): one line, the lag, exit 4."""
    sink = sink_factory(partitions={"src": 1}, tables="a", prefix="scd")
    produce_json(bootstrap_servers, sink.topic, 0, [{"id": 1, "table": "a"}, {"id": 2, "table": "a"}])
    catalog = {"name": "down", "type": "rest", "uri": "http://user:secret@127.0.0.1:1/catalog"}
    config = _changed(sink.config_file, tmp_path, catalog=catalog)
    gc.collect()  # as above
    capfd.readouterr()

    assert main(["status", "--config", str(config)]) == 4
    out, err = capfd.readouterr()
    assert f"{sink.topic}[0]: committed - end 2 lag 2" in out
    assert "tables:\n  (not read: see the catalog line above)" in out
    assert "Traceback" not in out + err and "secret" not in out + err
    [line] = err.strip().splitlines()
    assert line.startswith(
        "fanout-sink status: catalog 'down' (catalog.type=rest, catalog.uri=http://127.0.0.1:1/catalog) "
        "is unreachable: "
    ), line
    assert "(tables not shown)" in line and "; fix: " in line and len(line) < 400
