"""The executors' packed environment: what goes in, when it is rebuilt, what a cluster run gets."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from fanout_sink.errors import StackError
from fanout_sink.spark import shipping


def test_the_requirements_leave_pyspark_out_and_pin_what_the_driver_runs() -> None:
    import pyarrow

    pinned = shipping.executor_requirements()

    assert not [r for r in pinned if r.lower().startswith(("pyspark", "py4j"))]
    assert f"pyarrow=={pyarrow.__version__}" in pinned
    assert all("==" in r for r in pinned) and not [r for r in pinned if "extra" in r]


def test_the_fingerprint_follows_the_packed_source_files_only(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "fanout_sink").mkdir()
    module = tmp_path / "fanout_sink" / "a.py"
    module.write_text("x = 1\n")
    first = shipping.fingerprint(tmp_path, ["pyarrow==1"])
    (tmp_path / "fanout_sink" / "__pycache__").mkdir()
    (tmp_path / "fanout_sink" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "notes.txt").write_text("not packed")
    assert shipping.fingerprint(tmp_path, ["pyarrow==1"]) == first

    (tmp_path / "tests" / "bench").mkdir(parents=True)
    (tmp_path / "tests" / "bench" / "b.py").write_text("developer tooling\n")
    assert shipping.fingerprint(tmp_path, ["pyarrow==1"]) == first

    module.write_text("x = 2\n")
    assert shipping.fingerprint(tmp_path, ["pyarrow==1"]) != first
    assert shipping.fingerprint(tmp_path, ["pyarrow==2"]) != shipping.fingerprint(tmp_path, ["pyarrow==1"])


def test_the_pack_is_built_from_the_package_and_nothing_else() -> None:
    """The package, as its wheel holds it; the chaos runner and the benchmarks live in tests/."""
    root = shipping.project_root()
    packed = {str(path.relative_to(root)) for path in shipping.source_files(root)}

    assert {"pyproject.toml", "fanout_sink/spark/shipping.py", "fanout_sink/protocol/worker.py"} <= packed
    assert "fanout_sink/protocol/event_schemas/Envelope.avsc" in packed
    # The native reader: its source and setup.py (the pack's install compiles it), never a build of it.
    assert {"setup.py", "fanout_sink/kafka/librdkafka_arrow.c"} <= packed
    assert not [name for name in packed if name.endswith(".so")]
    assert not [
        name
        for name in packed
        if name not in {"pyproject.toml", "setup.py", "README.md"} and not name.startswith("fanout_sink/")
    ]


def test_a_cluster_master_without_a_pack_says_to_run_fanout_sink_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FANOUT_SINK_CACHE", str(tmp_path))

    with pytest.raises(StackError, match="packed Python environment") as raised:
        shipping.cluster_conf("spark://10.0.0.5:7077")
    assert "fanout-sink pack" in raised.value.fix


def test_a_cluster_run_ships_the_pack_and_a_loopback_master_keeps_the_driver_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FANOUT_SINK_CACHE", str(tmp_path))
    pack = shipping.cached_pack_path()
    pack.parent.mkdir(parents=True)
    pack.write_bytes(b"")

    remote = shipping.cluster_conf("spark://10.0.0.5:7077")
    local = shipping.cluster_conf("spark://127.0.0.1:7077")

    assert remote == {
        "spark.archives": f"{pack}#environment",
        "spark.pyspark.python": "./environment/bin/python",
    }
    assert local == {**remote, "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


@pytest.mark.timeout(1200)
def test_the_pack_holds_the_project_and_its_dependencies_but_not_pyspark(executor_pack: Path) -> None:
    with tarfile.open(executor_pack) as archive:
        names = archive.getnames()
    site = [n.split("site-packages/", 1)[1].split("/")[0] for n in names if "site-packages/" in n]

    assert {"fanout_sink", "pyarrow", "pyiceberg", "confluent_kafka"} <= set(site)
    assert "pyspark" not in site and "py4j" not in site
    assert "bin/python" in names
    packed = {n.split("site-packages/", 1)[-1] for n in names}
    assert "fanout_sink/spark/shipping.py" in packed
    assert not {"bench", "chaos", "support", "tests"} & set(site)  # the developer tooling stays in tests/
    # Package data, including what a link in the checkout points at (event_schemas -> schemas/events).
    assert {
        "fanout_sink/protocol/event_schemas/Envelope.avsc",
        "fanout_sink/spark/poms/spark-connectors.xml",
    } <= packed
