"""What executors on other machines run: the project and its Python dependencies as one packed venv.

PySpark documents three ways to ship Python code ("Python Package Management"); this is the venv-pack
one: a fresh virtual environment with a normal (non-editable) install of the project, packed into a
``.tar.gz`` that Spark hands to every executor through ``spark.archives=<pack>#environment``, whose
Python workers then run ``./environment/bin/python``. PySpark itself stays out of the pack: an
executor imports it from its Spark distribution (``$SPARK_HOME/python/lib/pyspark.zip``, put on
``PYTHONPATH`` by the executor), so the pack cannot disagree with the cluster's Spark version.

The dependencies are pinned to the versions the driver runs with, so the driver and its executors
agree on pyarrow, pyiceberg and friends. Like every venv-pack archive, the pack holds the venv's
``bin/python`` as a link to the interpreter it was built with: that interpreter must exist at the
same path on the executors' hosts (true here; on a real cluster build the pack on a host like them).

A pack is cached under the jar cache, named by a hash of the project's files, its pyproject and the
interpreter, so building it twice costs nothing and a changed source file builds a new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from fanout_sink import jars
from fanout_sink.errors import StackError
from fanout_sink.processes import run_or_raise

ENVIRONMENT = "environment"
"""The folder an executor unpacks the pack into (the ``#environment`` of ``spark.archives``)."""
EXECUTOR_PYTHON = f"./{ENVIRONMENT}/bin/python"
_LEFT_OUT = frozenset({"pyspark", "py4j"})  # from the Spark distribution on each executor
_PROJECT_FILES = ("pyproject.toml", "setup.py", "README.md")  # setup.py: the native reader's extension
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")
_INSTALL_TIMEOUT_S = 1200
_COMPLETE = ".complete"


def project_root() -> Path:
    """The source tree the running ``fanout_sink`` was imported from (an editable install or a checkout)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise StackError(
            f"no pyproject.toml next to the imported fanout_sink ({root}): packing needs the source tree",
            "run `fanout-sink pack` from a checkout of the project (or its editable install)",
        )
    return root


def executor_requirements(root: Path | None = None) -> list[str]:
    """The runtime requirements of the packed source tree's pyproject, without PySpark; each one the
    driver has installed is pinned to that version, so that both sides run the same pyarrow."""
    with ((root or project_root()) / "pyproject.toml").open("rb") as handle:
        declared: list[str] = tomllib.load(handle)["project"]["dependencies"]
    pinned = []
    for requirement in declared:
        spec, _, marker = requirement.partition(";")
        match = _NAME.match(spec)
        if match is None or match[1].lower() in _LEFT_OUT:
            continue
        name, extras = match[1], match[2] or ""
        try:
            pin = f"{name}{extras}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            pin = spec.strip()  # new in the pyproject, not installed here yet: its declared range
        pinned.append(pin + (f";{marker}" if marker else ""))
    return pinned


def source_files(root: Path) -> list[Path]:
    """What the pack's wheel is built from: the package, whole. The chaos runner and the benchmarks
    live in ``tests/``, outside it; ``devtools`` (the local servers and the demo that ``fanout-sink
    stack|demo`` run) is part of the product's wheel, so the pack holds what ``pip install`` would,
    with no list of what to leave out. Links are followed: ``protocol/event_schemas`` links to the
    repository's ``schemas/events``, and a copy of the link alone would dangle."""
    package = sorted(
        Path(folder, name)
        for folder, folders, names in os.walk(root / "fanout_sink", followlinks=True)
        if "__pycache__" not in Path(folder).parts
        for name in names
        if not name.endswith(".so")  # an editable install's extension: the pack's install builds its own
    )
    return [root / name for name in _PROJECT_FILES if (root / name).is_file()] + package


def fingerprint(root: Path, requirements: list[str]) -> str:
    """Changes with any packed source file, the pins or the interpreter; nothing else."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}\n{sys.base_prefix}\n{sorted(requirements)}\n".encode())
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cached_pack_path() -> Path:
    """Where the pack of the current source tree lives (whether or not it was built yet)."""
    root = project_root()
    return _packs_dir() / f"fanout-sink-env-{fingerprint(root, executor_requirements())}.tar.gz"


def _run(command: list[str], what: str) -> None:
    run_or_raise(
        command,
        f"{what} failed",
        "read pip's error below; PyPI must be reachable (or pip's cache hold the wheels)",
        _INSTALL_TIMEOUT_S,
    )


def _copy_project(root: Path, into: Path) -> None:
    """A copy of just what the wheel needs, so that building it leaves nothing in the checkout."""
    for path in source_files(root):
        target = into / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _packs_dir() -> Path:
    return jars.cache_dir() / "packs"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (two test sessions, or a test and an operator, may build at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _dependencies_env(requirements: list[str]) -> Path:
    """A venv with the pinned dependencies, kept between builds: a source change then reinstalls
    only the project (seconds), not pyarrow and friends (minutes)."""
    key = hashlib.sha256(f"{sys.version}\n{sys.base_prefix}\n{sorted(requirements)}".encode()).hexdigest()
    env = _packs_dir() / f"deps-{key[:16]}"
    if (env / _COMPLETE).is_file():
        return env
    shutil.rmtree(env, ignore_errors=True)  # a build that died half-way
    _run([sys.executable, "-m", "venv", str(env)], "creating the venv to pack")
    _run([*_pip(env), *requirements], "installing the dependencies into the pack")
    (env / _COMPLETE).touch()
    return env


def _pip(env: Path) -> list[str]:
    return [str(env / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]


def _prune(keep: Path, newest: int = 3) -> None:
    """Every source change makes a pack of about 200 MB: keep the ``newest`` few (other checkouts
    sharing the cache may still run theirs), delete the rest."""
    packs = sorted(_packs_dir().glob("fanout-sink-env-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    for old in packs[:-newest]:
        if old != keep:
            old.unlink(missing_ok=True)


def build(output: Path | None = None) -> Path:
    """The pack of the current source tree: from the cache when built before, else built now.

    ``output`` also gets a copy (for ``spark-submit --archives`` on another machine).
    """
    import venv_pack

    packed = cached_pack_path()
    with _locked(_packs_dir() / ".lock"):
        if not packed.is_file():
            env = _dependencies_env(executor_requirements())
            with tempfile.TemporaryDirectory(prefix="fanout-sink-pack-", dir=packed.parent) as tmp:
                work = Path(tmp)
                _copy_project(project_root(), work / "src")
                _run([*_pip(env), "--no-deps", "--force-reinstall", str(work / "src")],
                     "installing fanout-sink into the pack")  # fmt: skip
                partial = work / "pack.tar.gz"
                venv_pack.pack(prefix=str(env), output=str(partial), compress_level=1, verbose=False)
                os.replace(partial, packed)  # atomic: a reader never sees a half-written pack
            _prune(keep=packed)
    if output is not None and output.resolve() != packed:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(packed, output)
        return output
    return packed


def require_pack() -> Path:
    """The built pack of the current source tree, or a StackError that says how to build it."""
    packed = cached_pack_path()
    if not packed.is_file():
        raise StackError(
            "a cluster master needs the packed Python environment for its executors, and none is "
            f"built for this version of the project ({packed} is missing)",
            "run `fanout-sink pack` once (it builds and caches the pack), then start the sink again",
        )
    return packed


def cluster_conf(master: str) -> dict[str, str]:
    """Spark properties for a cluster master (not ``local``) that the sink starts itself.

    Executors get the pack and run its Python; a master on loopback means a one-machine cluster, so
    the driver listens on loopback too (elsewhere Spark's default, the host's address, is what remote
    executors reach; ``spark.driver.host`` overrides it).
    """
    conf = {
        "spark.archives": f"{require_pack()}#{ENVIRONMENT}",
        "spark.pyspark.python": EXECUTOR_PYTHON,
    }
    host = urllib.parse.urlsplit(master).hostname or ""
    if host in {"127.0.0.1", "localhost", "::1"}:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    return conf
