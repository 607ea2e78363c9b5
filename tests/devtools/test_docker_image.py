"""docker/'s image, built for real (opt-in: ``-m docker``; run it when docker/ changes).

No container can start here (the sandbox refuses ``setrlimit``), so podman builds with chroot isolation
on a Debian base made by debootstrap in place of the registry's Python image
(:mod:`fanout_sink.devtools.image_build`; podman and debootstrap are installed with apt-get when
missing). The build runs the image's own checks (``fanout-sink --version``, ``validate --offline`` on
docker/sink.yaml); this test then reads the built image without running it: its entry point and
command, and, mounted, the files its services need at start (every jar set, the executors' pack).

    .venv/bin/python -m pytest -m docker -s tests/devtools/test_docker_image.py

A cold build (no base, no layers) downloads about 1.5 GB and takes many minutes; a warm one reuses
podman's layer cache in ``~/.cache/fanout-sink/podman``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from fanout_sink import cli, jars
from fanout_sink.devtools import image_build

pytestmark = pytest.mark.docker

TAG = "localhost/fanout-sink:image-test"


@pytest.fixture(scope="module")
def built() -> image_build.Build:
    build = image_build.build_image(image_build.Podman.in_cache(), TAG)
    made = "made" if build.base_made else "cached"
    print(f"\nbase {build.base}: {made} in {build.base_s:.0f} s; image built in {build.build_s:.0f} s")
    return build


@pytest.fixture
def image_root(built: image_build.Build) -> Iterator[Path]:
    """The image's files, mounted read-only by podman (no container is created)."""
    podman = image_build.Podman.in_cache()
    mounted = subprocess.run(
        podman.command("image", "mount", built.tag), capture_output=True, text=True, check=True
    )
    try:
        yield Path(mounted.stdout.strip())
    finally:
        subprocess.run(podman.command("image", "unmount", built.tag), capture_output=True, check=False)


def _config(tag: str) -> dict[str, object]:
    podman = image_build.Podman.in_cache()
    done = subprocess.run(podman.command("image", "inspect", tag), capture_output=True, text=True, check=True)
    config = json.loads(done.stdout)[0]["Config"]
    assert isinstance(config, dict)
    return config


def test_the_build_runs_the_cli_and_validates_the_example(built: image_build.Build) -> None:
    # `fanout-sink --version`'s first line, then validate's verdict on docker/sink.yaml.
    assert f"fanout-sink {metadata.version('fanout-sink')}\n" in built.log
    assert "ok  offline: the broker, topics, warehouse and catalog were not contacted" in built.log
    assert "valid: nothing stops this sink from starting" in built.log
    assert built.base.startswith("localhost/fanout-sink-base:"), "built on the stand-in, not a registry image"


def test_the_image_runs_the_compose_sink_by_default(built: image_build.Build) -> None:
    config = _config(built.tag)
    compose = yaml.safe_load((image_build.ROOT / "docker" / "compose.yaml").read_text())
    assert config["Entrypoint"] == ["fanout-sink"]
    assert config["Cmd"] == compose["services"]["sink"]["command"]
    assert config["WorkingDir"] == "/opt/fanout-sink"


def test_the_image_holds_every_jar_set_and_the_pack(built: image_build.Build, image_root: Path) -> None:
    """What the services need at start is in the image: no container downloads anything."""
    env = dict(item.split("=", 1) for item in _config(built.tag)["Env"])  # type: ignore[attr-defined]
    cache = image_root / env["FANOUT_SINK_CACHE"].lstrip("/")
    for name, jar_set in cli.jar_sets().items():
        folder = cache / jars.jar_dir(jar_set).relative_to(jars.cache_dir())
        assert folder.is_dir() and any(folder.glob("*.jar")), f"jar set {name}: no jars at {folder}"
    packs = list((cache / "packs").glob("fanout-sink-env-*.tar.gz"))
    assert len(packs) == 1 and packs[0].stat().st_size > 50_000_000, packs
    assert (image_root / "opt/fanout-sink/docker/sink.yaml").is_file()
    assert (image_root / "usr/local/bin/fanout-sink").is_file()
