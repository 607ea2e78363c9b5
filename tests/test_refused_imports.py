"""Packages the sink's processes refuse (refused_imports.py): the driver of ``fanout-sink run`` loads
the app's modules without pandas, and the refusal ends with the run and never applies where pandas is
loaded already. The workers' side is in spark/test_worker_daemon.py; the memory it saves is a
benchmark (docs/benchmarks/memory.md)."""

from __future__ import annotations

import subprocess
import sys

from fanout_sink.refused_imports import RefuseImports, refusing

_DRIVER = """
import sys
from fanout_sink import cli

def app_modules(args):  # what the run's driver imports, without starting anything
    import fanout_sink.protocol.coordinator, fanout_sink.spark.app, pyiceberg.io.pyarrow, pyspark.sql
    print("pandas" in sys.modules)
    return 0

cli._run_app = app_modules
cli.main(["run", "--config", "unused.yaml"])
print("pandas" in sys.modules)
import pandas
print("after the run", pandas.__name__)
"""


def test_the_run_drivers_modules_load_without_pandas_and_it_is_importable_after_the_run() -> None:
    done = subprocess.run([sys.executable, "-c", _DRIVER], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    during, after, imported = done.stdout.splitlines()
    assert during == "False", "the driver of fanout-sink run imported pandas"
    assert after == "False"
    assert imported == "after the run pandas"


def test_nothing_is_refused_where_the_package_is_loaded_already() -> None:
    import json  # loaded by now in any interpreter

    with refusing("this test", ("json",)) as refused:
        assert not refused
        assert not any(isinstance(f, RefuseImports) for f in sys.meta_path)
    with refusing("this test", ("no_such_package_here",)) as refused:
        assert refused
        try:
            import no_such_package_here.sub  # type: ignore[import-not-found]  # noqa: F401
        except ModuleNotFoundError as exc:
            assert "not imported in this test" in str(exc)
        else:
            raise AssertionError("the refused package was imported")
    assert not any(isinstance(f, RefuseImports) for f in sys.meta_path), "the finder outlived the block"
    assert json
