"""The app's PySpark daemon (spark/worker_daemon.py): started the way Spark starts one, it has the
task's imports loaded before it forks any worker and runs PySpark's own daemon protocol; its zip
importers read their archive again only when it changed."""

from __future__ import annotations

import struct
import subprocess
import sys
import zipfile
import zipimport
from pathlib import Path

from fanout_sink.spark.worker_daemon import reread_only_changed_archives


def _daemon(module: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module, "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def _maps_after_start(daemon: subprocess.Popen[bytes]) -> str:
    """The daemon's memory map once it listens (it writes its port first, as Spark reads it)."""
    assert daemon.stdout is not None and daemon.stdin is not None
    (port,) = struct.unpack(">i", daemon.stdout.read(4))
    assert port > 0
    maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    daemon.stdin.close()  # Spark's way of stopping it; PySpark's daemon then exits with status 1
    daemon.wait(timeout=60)
    return maps


def test_the_daemon_has_the_tasks_imports_before_it_forks_and_stops_when_spark_closes_its_stdin() -> None:
    # librdkafka is loaded by confluent_kafka, which only the sink's task imports.
    ours = _maps_after_start(_daemon("fanout_sink.spark.worker_daemon"))
    assert "librdkafka" in ours
    assert "librdkafka" not in _maps_after_start(_daemon("pyspark.daemon"))
    assert "/pandas/" not in ours, "pandas' extension modules were loaded: the daemon let pandas in"


_WITHOUT_PANDAS = """
import sys
from fanout_sink.refused_imports import NEVER_IMPORTED, RefuseImports
from fanout_sink.spark.worker_daemon import TASK_MODULE
sys.meta_path.insert(0, RefuseImports(NEVER_IMPORTED, "fanout_sink's Spark workers (spark/worker_daemon.py)"))
import importlib
importlib.import_module(TASK_MODULE)
import pyarrow as pa
import pyarrow.dataset
assert not pa.lib._pandas_api.have_pandas
assert "pandas" not in sys.modules
pa.table({"id": [1, 2]}).filter(pyarrow.dataset.field("id") > 1)
try:
    import pandas.core.frame
except ModuleNotFoundError as exc:
    print(exc)
"""


def test_the_workers_modules_load_and_run_without_pandas_and_asking_for_it_names_the_daemon() -> None:
    """Imported alone, the task's modules pull pandas in (pyarrow.dataset's set-up asks pyarrow's shim);
    behind the daemon's finder they load, Arrow works, and pandas stays out with an error saying why."""
    alone = subprocess.run(
        [sys.executable, "-c", "import sys, fanout_sink.spark.task; print('pandas' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert alone.stdout.strip() == "True", "the task's imports no longer pull pandas: the refusal can go"
    refused = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PANDAS], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 0, refused.stderr
    assert "pandas is not imported in fanout_sink's Spark workers" in refused.stdout
    assert "spark/worker_daemon.py" in refused.stdout


def _zip(path: Path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, source in modules.items():
            archive.writestr(f"{name}.py", source)


def test_a_zip_importer_reads_its_archive_again_only_when_the_archive_changed(tmp_path: Path) -> None:
    archive = tmp_path / "code.zip"
    _zip(archive, {"first": "X = 1\n"})
    reads: list[str] = []
    original = zipimport.zipimporter.invalidate_caches

    def counted(importer: zipimport.zipimporter) -> None:
        reads.append(importer.archive)
        original(importer)

    invalidate = reread_only_changed_archives(counted)
    importer = zipimport.zipimporter(str(archive))
    invalidate(importer)
    invalidate(importer)
    invalidate(importer)
    assert len(reads) == 1  # the first call reads; unchanged, the others do not

    _zip(archive, {"first": "X = 1\n", "second": "Y = 2\n"})  # another size: the archive changed
    invalidate(importer)
    assert len(reads) == 2
    spec = importer.find_spec("second")
    assert spec is not None, "the module added to the changed archive is found after the re-read"
