"""The planner prototype (``tests/bench/python_source``) lands exactly the produced rows, also when
it takes over a sink that Spark's Kafka source planned until then (the checkpoint migration path)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from bench import ours, python_source, side_by_side
from bench.context import RunContext, child_env
from bench.end_to_end import produce
from bench.landed import check_same_rows, landed
from bench.workload import Variant, values

from fanout_sink.catalog import load_catalog
from fanout_sink.kafka.clients import KafkaClientFactory

pytestmark = [pytest.mark.usefixtures("own_spark"), pytest.mark.bench]

VARIANT = Variant("uniform", 3)
HALF = 600
CAP = 400  # below each half: several batches per run, so the reader's own cap plans each of them


def _run(ctx: RunContext, config: Path, planner: str) -> str:
    """Both planners on one class path (``--keep-kafka-jars``): the app's, whose class archive the
    suite's app runs keep mapped. Without Kafka's jars the Python planner's JVM has a class path of its
    own, hence an archive of its own, dumped at exit whenever it is not cached (73 s of one loaded run's
    exit). The planner reads no Kafka jar either way; the side-by-side smoke runs it without them."""
    log = ctx.folder / f"{planner}.log"
    extra = ["--available-now", "--planner", planner, "--keep-kafka-jars"]
    command = ours.app_command(config, ctx.master, CAP, extra, python_source.MODULE)
    with log.open("w") as out:
        code = subprocess.run(command, env=child_env(), stdout=out, stderr=subprocess.STDOUT, check=False)
    text = log.read_text()
    assert code.returncode == 0, text[-3000:]
    return text


def test_python_planner_takes_over_from_the_kafka_source_with_exact_rows(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    records = values(VARIANT, 2 * HALF)
    values_file = tmp_path / "values.jsonl"
    values_file.write_bytes(b"\n".join(records) + b"\n")
    topic = f"python-source-{tmp_path.name[-12:]}"
    produce(bootstrap_servers, topic, records[:HALF])
    ctx = RunContext(
        bootstrap=bootstrap_servers,
        topic=topic,
        variant=VARIANT,
        records=2 * HALF,
        values_file=values_file,
        commit_interval_s=1.0,
        cores=2,
        max_offsets_per_trigger=CAP,
        folder=tmp_path / "run",
    )
    catalog = ctx.prepare()
    config = ctx.folder / "sink.yaml"
    config.write_text(yaml.safe_dump(ours.sink_config(ctx, ctx.unique_name("python-source"))))
    try:
        # The product's planner first: its checkpoint and the sink group hold the first half.
        _run(ctx, config, "kafka")
        assert sum(len(t.ids) for t in landed(catalog, VARIANT.table_names()).values()) == HALF
        producer = KafkaClientFactory({"bootstrap.servers": bootstrap_servers}).producer({})
        for n, value in enumerate(records[HALF:]):
            producer.produce(topic, value=value, partition=n % 2)
        assert producer.flush(60) == 0
        # Then the Python planner on the same checkpoint: it must neither skip nor repeat a record.
        log = _run(ctx, config, "python")
        assert "planner python: 2 batches" in log  # 600 records, capped at 400 per batch
    finally:
        admin = KafkaClientFactory({"bootstrap.servers": bootstrap_servers}).admin()
        admin.delete_topics([topic])[topic].result(timeout=30)
    expected = side_by_side.expected_landing(values_file, VARIANT)
    check_same_rows(
        (side_by_side.GENERATED, expected),
        ("python-source", landed(load_catalog(ctx.settings), VARIANT.table_names())),
    )
