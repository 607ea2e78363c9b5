"""docker/'s image, built for real (opt-in: ``-m docker``; run it when docker/ changes).

No container can start here (the sandbox refuses ``setrlimit``), so podman builds with chroot isolation
on a Debian base made by debootstrap in place of the registry's Python image
(``tests/support/image_build.py``; podman and debootstrap are installed with apt-get when
missing). The build runs the image's own checks (``fanout-sink --version``, ``validate --offline`` on
docker/sink.yaml); this test then reads the built image without running it: its entry point and
command, and, mounted, the files its services need at start (every jar set, the executors' pack).

    .venv/bin/python -m pytest -m docker -s tests/devtools/test_docker_image.py

Measured here (2 cores shared with other work): cold (no base, no layers) 581 s, the base's
debootstrap 135 s of it; after a change under fanout_sink/ 383-409 s (install, jars and pack again);
after a change to docker/sink.yaml only 10 s; unchanged 2-8 s. The image is 3.4 GB; podman's storage
(the base, the current build's layers) stays in ``~/.cache/fanout-sink/podman``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from support import image_build

from fanout_sink import cli, jars

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def built() -> image_build.Build:
    build = image_build.build_image(image_build.Podman.in_cache())  # compose's tag: one layer chain kept
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


def _step_output(log: str, command_part: str) -> str:
    """What the build printed for the step whose command holds ``command_part``."""
    steps = re.split(r"^STEP \d+/\d+: ", log, flags=re.MULTILINE)
    [step] = [text for text in steps if command_part in text.split("\n", 1)[0]]
    return step.split("\n", 1)[1]


def test_the_build_runs_the_cli_and_validates_the_example(built: image_build.Build) -> None:
    assert built.base.startswith("localhost/fanout-sink-base:"), "built on the stand-in, not a registry image"
    output = _step_output(built.log, "validate --offline --config docker/sink.yaml")
    if output.startswith("--> Using cache"):
        # Unchanged inputs: the step's layer is reused, and a RUN's layer exists only if it exited 0.
        return
    # `fanout-sink --version`'s first line, then validate's verdict on docker/sink.yaml.
    assert f"fanout-sink {metadata.version('fanout-sink')}\n" in output
    assert "ok  offline: the broker, topics, warehouse and catalog were not contacted" in output
    assert "valid offline: nothing in the config or the routes stops this sink" in output


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
