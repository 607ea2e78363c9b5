"""The takeover's checks (``connect_import/takeover.py``): the control events it reads, decoded as
the Java sink writes them (``connect_import/events.py``), and its refusals and seeding on the real
broker."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import fastavro
import pytest

from fanout_sink.config.loading import load_config
from fanout_sink.connect_import import events, takeover, translator

_UUID = {"type": "fixed", "name": "uuid_fixed", "namespace": "", "size": 16}
_REF = {
    "type": "record", "name": "TableReference",
    "fields": [{"name": "namespace", "type": {"type": "array", "items": "string"}},
               {"name": "name", "type": "string"}],
}  # fmt: skip
_PAYLOAD = {
    "type": "record", "name": "DataWritten",
    "fields": [{"name": "commit_id", "type": "uuid_fixed"}, {"name": "table_reference", "type": _REF},
               {"name": "data_files", "type": {"type": "array", "items": "string"}}],
}  # fmt: skip
EVENT_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "org.apache.iceberg.connect.events",
    "fields": [{"name": "id", "type": _UUID}, {"name": "type", "type": "int"},
               {"name": "group_id", "type": "string"}, {"name": "payload", "type": _PAYLOAD}],
}  # fmt: skip
"""A DataWritten event's schema as the Java sink frames it: its UUID fixed has no namespace inside
namespaced records, so a later bare reference resolves elsewhere."""


def java_event(group: str, table: str, files: list[str]) -> bytes:
    """A DataWritten event framed as Iceberg's AvroEncoderUtil writes it: magic C2 01,
    writeUTF(schema), datum."""
    namespace, name = table.rsplit(".", 1)
    datum = {
        "id": b"u" * 16, "type": 1, "group_id": group,
        "payload": {"commit_id": b"c" * 16, "table_reference": {"namespace": [namespace], "name": name},
                    "data_files": files},
    }  # fmt: skip
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(events.avro_short_names(EVENT_SCHEMA)), datum)
    text = json.dumps(EVENT_SCHEMA).encode()
    return b"\xc2\x01" + struct.pack(">H", len(text)) + text + body.getvalue()


def test_a_control_event_decodes_with_the_schema_it_carries() -> None:
    with pytest.raises(fastavro.schema.UnknownType):  # what fastavro makes of the schema as written
        fastavro.parse_schema(EVENT_SCHEMA)
    event = events.decode_event(java_event("connect-x", "ns.t", ["f"]))
    assert event["group_id"] == "connect-x" and event["type"] == 1
    assert event["payload"]["table_reference"] == {"namespace": ["ns"], "name": "t"}
    assert event["payload"]["data_files"] == ["f"]
    with pytest.raises(ValueError, match="magic"):
        events.decode_event(b"\x00\x01")


def test_the_takeover_refuses_without_offsets_and_while_a_commit_is_in_flight_then_seeds_the_sink_group(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    """On the real broker, with the connector's group, control topic and table summaries made by hand
    as the Java sink leaves them: no offsets, then files announced past the table's last commit, are
    refused naming what to do; once the table's summary covers them the sink group gets the offsets."""
    import pyarrow as pa
    from confluent_kafka import Consumer, Producer, TopicPartition
    from support.common import create_named_topic, produce_json

    from fanout_sink.catalog import CatalogSettings, load_catalog
    from fanout_sink.kafka.offsets import GroupOffsets
    from fanout_sink.protocol import group_layout

    name = f"kc-checks-{tmp_path.name[-12:].replace('_', '-')}"
    topic = create_named_topic(bootstrap_servers, f"{name}-src", partitions=2)
    control = create_named_topic(bootstrap_servers, f"{name}-ctl")
    produce_json(bootstrap_servers, topic, 0, [{"id": i} for i in range(5)])
    settings = CatalogSettings(
        name="lake", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh"
    )
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    table = catalog.create_table("shop.orders", schema=pa.schema([("id", pa.int64())]))
    props = {
        "name": name, "connector.class": translator.APACHE_CLASS, "topics": topic,
        "iceberg.tables": "shop.orders", "iceberg.control.topic": control, "iceberg.catalog": "lake",
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "iceberg.catalog.uri": f"jdbc:sqlite:{tmp_path}/c.db", "iceberg.catalog.warehouse": f"file://{tmp_path}/wh",
        "iceberg.kafka.bootstrap.servers": bootstrap_servers,
    }  # fmt: skip
    imported = translator.translate(props)
    (tmp_path / "sink.yaml").write_text(imported.yaml())
    config = load_config(tmp_path / "sink.yaml")

    with pytest.raises(translator.ImportError_, match=f"group 'connect-{name}' has no offsets"):
        takeover.take_over(imported, config)

    group = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"connect-{name}"})
    group.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    group.close()
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    producer.produce(control, b"not an Iceberg event")
    for _ in range(3):
        producer.produce(control, java_event(f"connect-{name}", "shop.orders", ["f.parquet"]))
    producer.produce(control, java_event("connect-other", "shop.orders", ["g.parquet"]))
    producer.flush(30)
    summary_key = f"kafka.connect.offsets.{control}.cg-control-{name}"  # as the Java coordinator names it
    table.append(pa.table({"id": [0]}), snapshot_properties={summary_key: json.dumps({"0": 2})})
    with pytest.raises(
        translator.ImportError_, match=r"shop\.orders: data files announced at .*\[0\]@3"
    ) as err:
        takeover.take_over(imported, config)
    assert str(err.value).startswith("iceberg.control.topic: the connector's last commit did not complete")

    other_key = f"kafka.connect.offsets.{control}.cg-control-other"  # another connector on the same topic
    table.append(pa.table({"id": [2]}), snapshot_properties={other_key: json.dumps({"0": 5})})
    with pytest.raises(translator.ImportError_, match=r"recorded up to 2"):
        takeover.take_over(imported, config)
    table.append(pa.table({"id": [1]}), snapshot_properties={summary_key: json.dumps({"0": 4})})
    taken = takeover.take_over(imported, config)
    assert taken.positions == {(topic, 0): 3} and taken.unstarted == [(topic, 1)]
    channel = group_layout.channel_in_use(config)
    reader = GroupOffsets(channel.clients, channel.sink_group)
    try:
        assert reader.committed([(topic, 0), (topic, 1)]) == {(topic, 0): 3, (topic, 1): None}
    finally:
        reader.close()
