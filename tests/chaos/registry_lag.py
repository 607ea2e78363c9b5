"""The ``registry-lag`` kind's source: Avro records in the Confluent wire format on their own topic,
whose writer schema the Schema Registry learns only after they are in the topic.

One sink reads one ``source.format``, so the registry-framed topic has a sink of its own (its own
name, control and dead-letter topics, checkpoints and table, the run's catalog): each cycle runs it
as a second process, ``fanout-sink run --available-now``, beside the chaos app. Its records are
checked as exactly as the JSON traffic's: every record's id once in ``TABLE``, no dead letter.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Producer
from support.registry import Registry, wire

from chaos.verify import Verdict
from fanout_sink.devtools.topics import read_to_end

SUBJECT_SUFFIX = "-value"
TABLE = "chaos_registry.orders"
"""Outside ``scenario.NAMESPACES``: the other kinds never pick it, and the JSON verdict never sees it."""
RECORDS = 300
"""Records of one cycle, all with the cycle's new writer schema."""
LAG_S = 10.0
"""How long the registry keeps answering 404 after a worker first asked for the new id: longer than
a chunk's 5 s wait budget, so at least one attempt fails and is retried."""


def schema(version: int) -> dict[str, Any]:
    """Writer schema ``version``: the same fields, a new schema text (so a new id) each version, as a
    producer's new build registers (a doc change)."""
    return {
        "type": "record",
        "name": "Order",
        "namespace": "chaos",
        "doc": f"version {version}",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "seq", "type": "long"},
            {"name": "amount", "type": "double"},
        ],
    }


def sink_config(main: dict[str, Any], topic: str, registry_url: str, work_dir: Path) -> dict[str, Any]:
    """The registry topic's sink: the chaos sink's Kafka, catalog and control settings, its own names."""
    name = f"{main['name']}-registry"
    return {
        **main,
        "name": name,
        "source": {"topics": [topic], "format": "confluent-avro", "schema-registry": {"url": registry_url}},
        "control": {**main["control"], "topic": f"{name}-control"},
        "tables": {TABLE: {}},
        "dynamic": None,
        "dead-letter": {"topic": f"{name}-dlq"},
        "spark": {**main["spark"], "checkpoint-location": str(work_dir / "registry-checkpoints")},
    }


def produce(bootstrap: str, topic: str, registry: Registry, version: int, count: int) -> int:
    """Register writer schema ``version``, hide its id (the registry node the sink asks has not
    replicated it), and write ``count`` records with it; the hidden id."""
    writer = schema(version)
    schema_id = registry.register(f"{topic}{SUBJECT_SUFFIX}", json.dumps(writer))
    registry.hide(schema_id)
    parsed = fastavro.parse_schema(writer)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        body = io.BytesIO()
        rid = f"v{version}-{i:06d}"
        fastavro.schemaless_writer(body, parsed, {"id": rid, "seq": i, "amount": i / 4})
        producer.produce(topic, key=rid.encode(), value=wire(schema_id, body.getvalue()))
    if producer.flush(60) != 0:
        raise RuntimeError(f"registry-lag: records to {topic} not acknowledged within 60 s")
    return schema_id


def asked(registry: Registry, schema_id: int) -> bool:
    """Whether a worker has looked the id up (and, while hidden, got a 404)."""
    return any(r.split("?")[0] == f"/schemas/ids/{schema_id}" for r in list(registry.requests))


def verify(bootstrap: str, topic: str, dead_letters: str, catalog: Any, verdict: Verdict) -> None:
    """Every record of ``topic`` once in ``TABLE``, none dead-lettered; counted into ``verdict``."""
    expected = Counter((m.key() or b"").decode() for m in read_to_end(bootstrap, [topic]))
    stray = len(read_to_end(bootstrap, [dead_letters]))
    try:
        landed = Counter(catalog.load_table(TABLE).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist())
    except Exception as exc:  # no table: every record lost
        verdict.problems.append(f"{TABLE}: cannot be read ({type(exc).__name__}: {exc})")
        landed = Counter()
    duplicates = sum((landed - expected).values())
    losses = sum((expected - landed).values())
    verdict.records += expected.total()
    verdict.rows += landed.total()
    verdict.duplicates += duplicates
    verdict.losses += losses
    verdict.dead_lettered += stray
    if duplicates or losses:
        verdict.problems.append(
            f"{TABLE}: {duplicates} duplicate and {losses} lost rows of {expected.total()} registry records"
        )
    if stray:
        verdict.problems.append(f"{dead_letters}: {stray} dead letters; the registry's records must all land")
