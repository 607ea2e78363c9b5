"""Fetches JVM jars from Maven Central with ``mvn`` into a cache folder and reuses them when present.

Each jar set is described by a pom that ships inside the package owning it (``poms/<name>.xml`` next
to the code that needs the jars); its cache folder is keyed by the pom's hash, so a version bump in
the pom fetches anew while an unchanged pom is never fetched twice. The product needs Spark's
connector jars; the developer stack adds the broker's jar set the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fanout_sink.errors import StackError


@dataclass(frozen=True)
class JarSet:
    """A set of jars named after its pom, ``poms/<name>.xml`` inside the package ``package``."""

    name: str
    package: str

    @property
    def pom_path(self) -> str:
        """Where the pom lives in the source tree, for error messages."""
        return f"{self.package.replace('.', '/')}/poms/{self.name}.xml"


_COMPLETE_MARKER = ".complete"
_FETCH_TIMEOUT_S = float(os.environ.get("FANOUT_SINK_MVN_TIMEOUT", "1200"))
_UNREACHABLE_HINTS = (
    "Could not transfer",
    "UnknownHostException",
    "Connection refused",
    "Connect to",
    "Network is unreachable",
    "timed out",
    "No plugin found for prefix",  # nothing cached and no repository answered
)


def cache_dir() -> Path:
    """Root of everything the project downloads; ``FANOUT_SINK_CACHE`` moves it (CI, shared disks)."""
    override = os.environ.get("FANOUT_SINK_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fanout-sink"


def require_tool(name: str, fix: str) -> str:
    """Path of an executable on PATH, or a StackError saying how to install it."""
    path = shutil.which(name)
    if path is None:
        raise StackError(f"`{name}` was not found on PATH", fix)
    return path


def _pom_text(jar_set: JarSet) -> str:
    return resources.files(jar_set.package).joinpath("poms", f"{jar_set.name}.xml").read_text()


def jar_dir(jar_set: JarSet) -> Path:
    digest = hashlib.sha256(_pom_text(jar_set).encode()).hexdigest()[:12]
    return cache_dir() / "jars" / f"{jar_set.name}-{digest}"


def fetch(jar_set: JarSet, timeout_s: float = _FETCH_TIMEOUT_S) -> Path:
    """Folder holding every runtime jar of ``jar_set``; downloads them on first use.

    The download lands in a temporary folder renamed into place only when mvn succeeded, so an
    interrupted fetch is never mistaken for a complete one.
    """
    target = jar_dir(jar_set)
    if (target / _COMPLETE_MARKER).exists():
        return target
    mvn = require_tool("mvn", "install Maven 3.8+ (Debian: `apt-get install -y maven`) and retry")
    require_tool("java", "install a JDK 17 (Debian: `apt-get install -y openjdk-17-jdk-headless`) and retry")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{jar_set.name}-", dir=target.parent))
    try:
        pom = work / "pom.xml"
        pom.write_text(_pom_text(jar_set))
        out = work / "jars"
        settings = resources.files("fanout_sink").joinpath("maven-settings.xml")
        user_settings = os.environ.get("FANOUT_SINK_MAVEN_SETTINGS")
        cmd = [
            mvn, "-B", "-ntp", "-q", "-gs", str(settings), "-f", str(pom),
            *(["-s", user_settings] if user_settings else []),
            "-Dmaven.wagon.http.retryHandler.count=2",
            "-Dmaven.wagon.rto=60000",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise StackError(
                f"fetching the {jar_set.name} jars with mvn took longer than {timeout_s:.0f}s",
                "check that Maven Central is reachable (proxy settings in ~/.m2/settings.xml), "
                "or raise FANOUT_SINK_MVN_TIMEOUT",
            ) from exc
        if proc.returncode != 0 or not any(out.glob("*.jar")):
            output = proc.stdout + proc.stderr
            tail = "\n".join(output.strip().splitlines()[-15:])
            unreachable = any(hint in output for hint in _UNREACHABLE_HINTS)
            raise StackError(
                f"mvn could not fetch the {jar_set.name} jars (exit {proc.returncode})",
                "Maven Central looks unreachable: check the network or the mirror/proxy in "
                "~/.m2/settings.xml, then retry"
                if unreachable
                else f"read the mvn output below; the pom is {jar_set.pom_path}",
                tail,
            )
        (out / _COMPLETE_MARKER).write_text(" ".join(cmd) + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def jars(jar_set: JarSet) -> list[Path]:
    """The jars of a set, sorted, fetched when missing."""
    return sorted(fetch(jar_set).glob("*.jar"))
