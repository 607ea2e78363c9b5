"""The takeover's checks (``connect_import/takeover.py``): the control events it reads, decoded as
the Java sink writes them (``connect_import/events.py``), and its refusals and seeding on the real
broker."""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pytest

from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
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


TABULAR_EVENT_SCHEMA = {
    "type": "record", "name": "io.tabular.iceberg.connect.events.Event",
    "fields": [{"name": "id", "type": _UUID}, {"name": "type", "type": "int"},
               {"name": "timestamp", "type": "long"},
               {"name": "payload", "type": {
                   "type": "record", "name": "io.tabular.iceberg.connect.events.CommitResponsePayload",
                   "fields": [{"name": "commitId", "type": "uuid_fixed"},
                              {"name": "tableName", "type": {**_REF, "name": "TableName"}},
                              {"name": "dataFiles",
                               "type": ["null", {"type": "array", "items": "string"}]}]}},
               {"name": "groupId", "type": "string"}],
}  # fmt: skip
"""Tabular's own events (``io.tabular.iceberg.connect.events``, up to 0.6.x): camelCase field names, a
COMMIT_RESPONSE (type 1) for Apache's DataWritten, and the control group as the group id."""


def _framed(schema: dict[str, object], datum: dict[str, object]) -> bytes:
    """An event framed as Iceberg's AvroEncoderUtil writes it: magic C2 01, writeUTF(schema), datum."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(events.avro_short_names(schema)), datum)
    text = json.dumps(schema).encode()
    return b"\xc2\x01" + struct.pack(">H", len(text)) + text + body.getvalue()


def java_event(group: str, table: str, files: list[str]) -> bytes:
    """A DataWritten event as Apache's sink (and Tabular's since it took Apache's events) writes it."""
    namespace, name = table.rsplit(".", 1)
    return _framed(EVENT_SCHEMA, {
        "id": b"u" * 16, "type": 1, "group_id": group,
        "payload": {"commit_id": b"c" * 16, "table_reference": {"namespace": [namespace], "name": name},
                    "data_files": files},
    })  # fmt: skip


def tabular_event(group: str, table: str, files: list[str]) -> bytes:
    """A COMMIT_RESPONSE event as Tabular's sink up to 0.6.x writes it."""
    namespace, name = table.rsplit(".", 1)
    return _framed(TABULAR_EVENT_SCHEMA, {
        "id": b"u" * 16, "type": 1, "timestamp": 0, "groupId": group,
        "payload": {"commitId": b"c" * 16, "tableName": {"namespace": [namespace], "name": name},
                    "dataFiles": files},
    })  # fmt: skip


def test_a_control_event_decodes_with_the_schema_it_carries() -> None:
    with pytest.raises(fastavro.schema.UnknownType):  # what fastavro makes of the schema as written
        fastavro.parse_schema(EVENT_SCHEMA)
    event = events.decode_event(java_event("connect-x", "ns.t", ["f"]))
    assert event["group_id"] == "connect-x" and event["type"] == 1
    assert event["payload"]["table_reference"] == {"namespace": ["ns"], "name": "t"}
    assert event["payload"]["data_files"] == ["f"]
    with pytest.raises(ValueError, match="magic"):
        events.decode_event(b"\x00\x01")


@dataclass
class _Connector:
    """A stopped connector's traces made by hand, as the Java sink leaves them: its source topic, its
    control topic, its catalog with ``shop.orders``, and the import of its config."""

    name: str
    topic: str
    control: str
    table: Any
    imported: translator.Imported
    config: SinkConfig

    def commit(self, group: str, offset: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.config.kafka["bootstrap.servers"], "group.id": group})
        consumer.commit(offsets=[TopicPartition(self.topic, 0, offset)], asynchronous=False)
        consumer.close()

    def announce(self, *values: tuple[int, bytes]) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.config.kafka["bootstrap.servers"]})
        for partition, value in values:
            producer.produce(self.control, value, partition=partition)
        assert producer.flush(30) == 0

    def table_commit(self, group: str, offsets: dict[str, int]) -> None:
        import pyarrow as pa

        key = f"kafka.connect.offsets.{self.control}.{group}"  # as the Java coordinator names it
        self.table.append(pa.table({"id": [1]}), snapshot_properties={key: json.dumps(offsets)})


def _connector(
    bootstrap: str,
    tmp_path: Path,
    connector_class: str,
    control_partitions: int = 1,
    source_partitions: int = 1,
) -> _Connector:
    import pyarrow as pa
    from support.common import create_named_topic

    from fanout_sink.catalog import CatalogSettings, load_catalog

    name = f"kc-{tmp_path.name[-14:].replace('_', '-')}"
    topic = create_named_topic(bootstrap, f"{name}-src", partitions=source_partitions)
    control = create_named_topic(bootstrap, f"{name}-ctl", partitions=control_partitions)
    settings = CatalogSettings(
        name="lake", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh"
    )
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    table = catalog.create_table("shop.orders", schema=pa.schema([("id", pa.int64())]))
    props = {
        "name": name, "connector.class": connector_class, "topics": topic,
        "iceberg.tables": "shop.orders", "iceberg.control.topic": control, "iceberg.catalog": "lake",
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "iceberg.catalog.uri": f"jdbc:sqlite:{tmp_path}/c.db", "iceberg.catalog.warehouse": f"file://{tmp_path}/wh",
        "iceberg.kafka.bootstrap.servers": bootstrap,
    }  # fmt: skip
    imported = translator.translate(props)
    (tmp_path / "sink.yaml").write_text(imported.yaml())
    return _Connector(name, topic, control, table, imported, load_config(tmp_path / "sink.yaml"))


def test_the_takeover_refuses_without_offsets_and_while_a_commit_is_in_flight_then_seeds_the_sink_group(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    """On the real broker, with the connector's group, control topic and table summaries made by hand
    as the Java sink leaves them: no offsets, then files announced past the table's last commit, are
    refused naming what to do; once the table's summary covers them the sink group gets the offsets."""
    from fanout_sink.kafka.offsets import GroupOffsets
    from fanout_sink.protocol import group_layout

    kc = _connector(bootstrap_servers, tmp_path, translator.APACHE_CLASS, source_partitions=2)
    topic, group = kc.topic, f"connect-{kc.name}"
    with pytest.raises(translator.ImportError_, match=f"group '{group}' has no offsets"):
        takeover.take_over(kc.imported, kc.config)

    kc.commit(group, 3)
    event = java_event(group, "shop.orders", ["f.parquet"])
    kc.announce((0, b"not an Iceberg event"), (0, event), (0, event), (0, event))
    kc.announce((0, java_event("connect-other", "shop.orders", ["g.parquet"])))
    kc.table_commit(group, {"0": 2})  # as Apache's coordinator names it: its Connect group
    with pytest.raises(
        translator.ImportError_, match=r"shop\.orders: data files announced at .*\[0\]@3"
    ) as err:
        takeover.take_over(kc.imported, kc.config)
    assert str(err.value).startswith("iceberg.control.topic: the connector's last commit did not complete")

    kc.table_commit("connect-other", {"0": 5})  # another connector on the same control topic
    with pytest.raises(translator.ImportError_, match=r"recorded up to 2"):
        takeover.take_over(kc.imported, kc.config)
    kc.table_commit(group, {"0": 4})
    taken = takeover.take_over(kc.imported, kc.config)
    assert taken.positions == {(topic, 0): 3} and taken.unstarted == [(topic, 1)]
    channel = group_layout.channel_in_use(kc.config)
    reader = GroupOffsets(channel.clients, channel.sink_group)
    try:
        assert reader.committed([(topic, 0), (topic, 1)]) == {(topic, 0): 3, (topic, 1): None}
    finally:
        reader.close()


def test_a_tabular_connector_is_checked_and_taken_over_under_its_control_group(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    """Tabular's sink names its control group (``cg-control-<name>``) in its events and snapshot
    summaries, and commits the source offsets to that group first, to Connect's group after: a crash
    between the two leaves Connect's group one commit behind. The takeover checks its events and
    seeds from its control group, as the sink's own restart does."""
    kc = _connector(bootstrap_servers, tmp_path, translator.TABULAR_CLASS)
    control_group = f"cg-control-{kc.name}"
    kc.commit(control_group, 5)
    kc.commit(f"connect-{kc.name}", 3)  # the second commit of the last round did not happen
    kc.announce((0, tabular_event(control_group, "shop.orders", ["f.parquet"])))
    kc.announce((0, java_event(control_group, "shop.orders", ["g.parquet"])))  # Tabular's later events
    kc.table_commit(control_group, {"0": 1})
    with pytest.raises(translator.ImportError_, match=r"shop\.orders: data files announced at .*\[0\]@1"):
        takeover.take_over(kc.imported, kc.config)
    kc.table_commit(control_group, {"0": 2})
    taken = takeover.take_over(kc.imported, kc.config)
    assert taken.positions == {(kc.topic, 0): 5}


def test_an_unfinished_announcement_on_any_control_partition_is_refused(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    """A control topic of several partitions: each partition's newest announcement is checked
    against that partition's recorded offset, not only the highest partition's."""
    kc = _connector(bootstrap_servers, tmp_path, translator.APACHE_CLASS, control_partitions=2)
    group = f"connect-{kc.name}"
    kc.commit(group, 3)
    event = java_event(group, "shop.orders", ["f.parquet"])
    kc.announce((0, event), (1, event), (1, event))
    kc.table_commit(group, {"0": 0, "1": 2})  # partition 1 committed, partition 0's file not
    with pytest.raises(translator.ImportError_, match=r"shop\.orders: data files announced at .*\[0\]@0"):
        takeover.take_over(kc.imported, kc.config)


def test_a_dropped_table_or_an_undecodable_control_record_is_a_one_line_refusal(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    kc = _connector(bootstrap_servers, tmp_path, translator.APACHE_CLASS)
    group = f"connect-{kc.name}"
    kc.commit(group, 3)
    kc.announce((0, java_event(group, "shop.gone", ["f.parquet"])))
    with pytest.raises(translator.ImportError_) as err:
        takeover.take_over(kc.imported, kc.config)
    message = str(err.value)
    assert message.startswith("iceberg.tables: shop.gone, announced at ") and "\n" not in message
    assert "not in the catalog" in message
    kc.announce((0, b'\xc2\x01\x00\x05{"ty'))
    with pytest.raises(translator.ImportError_) as err:
        takeover.take_over(kc.imported, kc.config)
    message = str(err.value)
    assert (
        message.startswith(f"iceberg.control.topic: the record at {kc.control}[0]@1 ") and "\n" not in message
    )
