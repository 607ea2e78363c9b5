"""Builds docker/'s image on a machine without a Docker engine or registry access: Debian's ``podman``
with ``--isolation chroot`` (no container is started: ``RUN`` steps run in a chroot), on a base image
made with ``debootstrap`` and ``podman import`` that stands in for the registry's Python image (the
Dockerfile takes its base as the build argument ``BASE``).

The build itself runs the image's checks (``fanout-sink --version``, ``fanout-sink validate --offline``
on docker/sink.yaml); :func:`build_image` returns its log so that a caller can see they ran. What is
downloaded comes from Debian's mirror (the base, the Dockerfile's ``apt-get``), PyPI and Maven Central.

Everything podman stores (the base image, the layer cache, the image) lives under the project's cache
(``podman/`` in :func:`fanout_sink.jars.cache_dir`), never in the machine's own container storage, so
the base and the layers are reused by the next build and removed by deleting that folder.

    PYTHONPATH=tests python -m support.image_build        # builds fanout-sink:local, prints the times
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fanout_sink.errors import StackError
from fanout_sink.jars import cache_dir
from fanout_sink.processes import run_or_raise

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"

BASE_SUITE = "trixie"
"""The registry's base image is a Debian trixie one (``python:*-slim-trixie``); so is the stand-in,
whose apt sources then serve the Dockerfile's ``apt-get install openjdk-21-jdk-headless maven``."""
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
"""What the registry's Python image gives the Dockerfile: ``python``, ``pip``, ``python -m venv``
(``fanout-sink pack``) and TLS roots for PyPI and Maven Central. Debian's Python is 3.13, the
registry image's 3.11: both within the project's ``requires-python``."""
MIRROR = "http://deb.debian.org/debian"
BASE_ENV = ("PIP_BREAK_SYSTEM_PACKAGES=1",)
"""Debian marks its Python externally managed (PEP 668); the registry's image installs with ``pip``
system-wide, so the stand-in lets pip do the same."""
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
"""The host's own CA roots (Debian's place for them): the stand-in base trusts them too, so that the
build reaches PyPI and Maven Central through whatever the host goes through (a TLS-inspecting proxy
included). The registry's base would not; the product image adds nothing of its own."""
TOOLS = {"podman": "podman", "debootstrap": "debootstrap"}
"""Program -> the Debian package that has it."""
DEFAULT_TAG = "fanout-sink:local"
"""compose.yaml's image name."""


@dataclass(frozen=True)
class Podman:
    """podman with its storage under ``root`` (images, layers) and ``root/run`` (its run state)."""

    root: Path

    @classmethod
    def in_cache(cls) -> Podman:
        return cls(cache_dir() / "podman")

    def command(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"), *args]

    @property
    def build_log(self) -> Path:
        """Where a build's output goes unless told otherwise."""
        return self.root / "build.log"

    def has_image(self, name: str) -> bool:
        done = subprocess.run(self.command("image", "exists", name), capture_output=True, check=False)
        return done.returncode == 0


@dataclass(frozen=True)
class Build:
    """One build of the image: its tag, the base it stood on, whether that base was made for it, the
    seconds the base and the build took, and the build's whole output."""

    tag: str
    base: str
    base_made: bool
    base_s: float
    build_s: float
    log: str


def ensure_tools() -> None:
    """podman and debootstrap on PATH, installed with apt-get when missing (Debian or Ubuntu, as root)."""
    missing = [package for program, package in TOOLS.items() if shutil.which(program) is None]
    if not missing:
        return
    fix = f"install them as root: apt-get install {' '.join(missing)}"
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise StackError(f"{', '.join(missing)} missing and apt-get cannot install them here", fix)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise StackError(f"`{' '.join(command)}` failed (exit code {done.returncode})", fix, tail)


def _local_cas() -> list[Path]:
    return sorted(LOCAL_CAS.rglob("*.crt")) if LOCAL_CAS.is_dir() else []


def base_name() -> str:
    """The stand-in base's name, its tag a digest of what makes it (the host's CA roots included): a
    change makes a new one."""
    digest = hashlib.sha256("\n".join([BASE_SUITE, MIRROR, *BASE_PACKAGES, *BASE_ENV]).encode())
    for ca in _local_cas():
        digest.update(ca.read_bytes())
    return f"localhost/fanout-sink-base:{BASE_SUITE}-{digest.hexdigest()[:12]}"


def ensure_base(podman: Podman) -> tuple[str, bool]:
    """The stand-in base image, made by debootstrap and imported unless podman already holds it;
    (its name, whether it was made now)."""
    name = base_name()
    if podman.has_image(name):
        return name, False
    podman.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=podman.root, prefix="rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        run_or_raise(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE,
             str(rootfs), MIRROR],
            f"debootstrap could not make a Debian {BASE_SUITE} root in {rootfs}",
            f"check that {MIRROR} answers and that debootstrap knows {BASE_SUITE} (Debian 12's does)",
            timeout_s=1800,
        )  # fmt: skip
        cas = _local_cas()
        if cas:
            for ca in cas:
                target = rootfs / ca.relative_to("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ca, target)
            run_or_raise(
                ["chroot", str(rootfs), "update-ca-certificates"],
                f"could not add the host's CA roots ({LOCAL_CAS}) to the base",
                f"check the certificates in {LOCAL_CAS}",
                timeout_s=300,
            )
        archive = Path(scratch) / "rootfs.tar"
        run_or_raise(
            ["tar", "-C", str(rootfs), "-cf", str(archive), "."],
            f"could not archive the base's root {rootfs}",
            f"check the free space under {podman.root}",
            timeout_s=600,
        )
        changes = [arg for env in BASE_ENV for arg in ("--change", f"ENV {env}")]
        run_or_raise(
            podman.command("import", *changes, "--change", 'CMD ["python3"]', str(archive), name),
            f"podman could not import the base image {name}",
            f"check podman's storage under {podman.root} (delete it to start over)",
            timeout_s=600,
        )
    return name, True


def build_image(
    podman: Podman, tag: str = DEFAULT_TAG, log_path: Path | None = None, no_cache: bool = False
) -> Build:
    """Build docker/Dockerfile from the repository root on the stand-in base; ``no_cache`` rebuilds
    every layer (the base is kept). The output is written to ``log_path`` (default: beside podman's
    storage) as it comes, since a cold build takes many minutes."""
    ensure_tools()
    started = time.monotonic()
    base, made = ensure_base(podman)
    base_s = time.monotonic() - started
    log_path = log_path or podman.build_log
    command = podman.command(
        "build", "--isolation", "chroot", "--build-arg", f"BASE={base}", "-f", str(DOCKERFILE), "-t", tag,
        *(["--no-cache"] if no_cache else []), str(ROOT),
    )  # fmt: skip
    started = time.monotonic()
    with log_path.open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=3600, check=False)
    build_s = time.monotonic() - started
    text = log_path.read_text()
    if done.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-30:])
        raise StackError(
            f"building {DOCKERFILE.relative_to(ROOT)} failed (exit code {done.returncode})",
            f"read the step that failed in {log_path}; the same step fails under `docker build`",
            tail,
        )
    # Each source change leaves the previous build's layers untagged (gigabytes): keep only the chains
    # of tagged images (this build's cache, the base).
    run_or_raise(
        podman.command("image", "prune", "--force"),
        "podman could not remove the previous builds' untagged layers",
        f"check podman's storage under {podman.root} (delete it to start over)",
        timeout_s=600,
    )
    return Build(tag, base, made, base_s, build_s, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m support.image_build",
        description="Build docker/'s image with podman (chroot isolation) on a debootstrap base.",
    )
    parser.add_argument("--tag", default=DEFAULT_TAG, help="the image's name (default: compose's)")
    parser.add_argument("--no-cache", action="store_true", help="rebuild every layer (the base is kept)")
    args = parser.parse_args(argv)
    try:
        build = build_image(Podman.in_cache(), args.tag, no_cache=args.no_cache)
    except StackError as exc:
        print(f"image_build: {exc}", file=sys.stderr)
        return 2
    made = "made" if build.base_made else "cached"
    print(f"base {build.base} ({made}, {build.base_s:.0f} s)")
    print(f"image {build.tag} built in {build.build_s:.0f} s (log: {Podman.in_cache().build_log})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
