"""No Docker engine runs here, so the image and compose definitions are checked statically: every
command they run parses with the real CLI, every file they copy exists, every jar set they fetch is
one the project defines, the images are pinned, and the servers' names, ports and environment agree
with what the sink's YAML (docker/sink.yaml, loaded with the real config loader) expects. The image
is also built for real by the opt-in test_docker_image.py (-m docker), and the example run against the
stack's servers by test_docker_example.py."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fanout_sink import cli
from fanout_sink.cli import build_parser
from fanout_sink.config.loading import load_config
from fanout_sink.config.models import SinkConfig
from fanout_sink.devtools import demo
from fanout_sink.devtools.stack import object_store, spark_cluster

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
SERVERS = {"kafka": "broker", "s3": "s3", "rest": "rest", "spark-master": "spark-master"}
"""The compose services that run one server each, by the ``stack serve`` name they run."""
WORKERS = ("spark-worker-1", "spark-worker-2")
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PINNED_TAG = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*(@sha256:[0-9a-f]{64})?$")


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    assert not pending, f"{path} ends inside a continued line"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def _exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value)
    return value


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _args(service: str) -> argparse.Namespace:
    """The service's command as the real CLI parses it."""
    return build_parser().parse_args(_services()[service]["command"])


def _sink_config(monkeypatch: pytest.MonkeyPatch) -> SinkConfig:
    """docker/sink.yaml loaded with the sink service's environment, as its container loads it."""
    for key, value in _services()["sink"]["environment"].items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("FANOUT_SINK_DEMO_DIR", _args("sink").dir)  # what `demo --dir` exports
    return load_config(DOCKER / "sink.yaml")


def _fanout_calls(instructions: list[tuple[str, str]]) -> list[list[str]]:
    """The ``fanout-sink`` commands the image's RUN lines call, without the program name and the
    ``NAME=value`` environment words before it."""
    runs = [arguments for kind, arguments in instructions if kind == "RUN"]
    calls = [shlex.split(part) for line in runs for part in line.split("&&")]
    unprefixed = [list(itertools.dropwhile(ENV_WORD.match, words)) for words in calls]
    return [words[1:] for words in unprefixed if words[:1] == ["fanout-sink"]]


def _base_image(instructions: list[tuple[str, str]]) -> str:
    """The image the Dockerfile builds on: ``FROM ${BASE}``, BASE a build argument whose default is
    the registry's image (the opt-in image test passes a local stand-in)."""
    assert instructions[0][0] == "ARG" and instructions[1] == ("FROM", "${BASE}"), instructions[:2]
    name, _, default = instructions[0][1].partition("=")
    assert name == "BASE" and default, "FROM ${BASE} with BASE's default the registry's image"
    return default


def test_dockerfile_copies_existing_files_and_runs_real_cli_commands() -> None:
    instructions = _dockerfile_instructions(DOCKER / "Dockerfile")
    kinds = [kind for kind, _ in instructions]
    assert "ENTRYPOINT" in kinds and "CMD" in kinds
    base = _base_image(instructions)
    assert PINNED_TAG.match(base), f"base image not pinned to a version: {base}"
    for kind, arguments in instructions:
        if kind == "COPY":
            *sources, _destination = shlex.split(arguments)
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    entrypoint = _exec_form(dict(instructions)["ENTRYPOINT"])
    assert entrypoint == ["fanout-sink"], "the image's entry point is the project's console script"
    build_parser().parse_args(_exec_form(dict(instructions)["CMD"]))
    calls = _fanout_calls(instructions)
    for call in calls:
        if call != ["--version"]:  # argparse's version action prints and exits
            build_parser().parse_args(call)
    assert ["pack"] in calls, "the executors' pack is built into the image, not at the sink's start"
    # The build proves the install: the console script runs and the example validates (offline: the
    # build cannot reach the compose network's hosts).
    assert ["--version"] in calls
    assert ["validate", "--offline", "--config", "docker/sink.yaml"] in calls
    # `fanout-sink pack` packs the source tree the running fanout_sink was imported from.
    install = next(
        arguments for kind, arguments in instructions if kind == "RUN" and "pip install" in arguments
    )
    assert " -e ." in install, "an editable install keeps pyproject.toml next to the imported package"


def test_the_image_fetches_every_jar_set_its_servers_and_the_sink_need() -> None:
    fetched = [
        name
        for call in _fanout_calls(_dockerfile_instructions(DOCKER / "Dockerfile"))
        if call[0] == "jars"
        for name in build_parser().parse_args(call).set
    ]
    known = cli.jar_sets()
    assert set(cli.JAR_SETS) == set(known), "the --set choices and the jar sets disagree"
    assert set(fetched) == set(known), "every jar set is in the image: no container downloads at start"
    for name in fetched:
        assert (ROOT / known[name].pom_path).is_file(), f"jar set {name}: no pom at {known[name].pom_path}"


def test_every_compose_service_runs_the_image_with_a_real_command() -> None:
    compose = _compose()
    assert set(compose) <= {"name", "services", "volumes", "networks"} | {
        k for k in compose if k.startswith("x-")
    }
    services = _services()
    assert set(services) == {*SERVERS, *WORKERS, "sink"}
    images = {service["image"] for service in services.values()}
    assert len(images) == 1, f"one image for every service, built from the project: {images}"
    for name, service in services.items():
        context = (DOCKER / service["build"]["context"]).resolve()
        assert context == ROOT and (context / service["build"]["dockerfile"]).is_file(), name
        build_parser().parse_args(service["command"])
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on {dependency}, which is not a service"
        for volume in service.get("volumes", []):
            assert volume.split(":", 1)[0] in compose.get("volumes", {}), f"{name}: volume {volume} undefined"


@pytest.mark.parametrize("service", [*SERVERS, *WORKERS])
def test_each_server_runs_with_the_tests_command_on_its_service_name(service: str) -> None:
    """`fanout-sink stack serve <name>`, the command the tests' servers run, listening where the other
    containers look: its service name (or every address), on the port its healthcheck probes."""
    args = _args(service)
    assert (args.command, args.action) == ("stack", "serve")
    assert args.name == SERVERS.get(service, "spark-worker")
    assert args.host in {service, "0.0.0.0"}, "other containers reach it by its service name"
    check = _services()[service].get("healthcheck")
    if check is not None:
        assert f"('{service}', {args.port})" in " ".join(check["test"]), "the healthcheck probes its port"
    for published in _services()[service].get("ports", []):
        assert published == f"{args.port}:{args.port}"


def test_the_sink_yaml_loads_and_names_the_compose_services(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _sink_config(monkeypatch)
    sink = _args("sink")
    assert sink.command == "demo" and Path(sink.config) == Path("docker/sink.yaml")
    assert (ROOT / sink.config).is_file()
    assert sink.bootstrap_servers == f"kafka:{_args('kafka').port}" == config.kafka["bootstrap.servers"]
    assert set(config.source.topics) == set(demo.TOPICS), "the demo produces to the topics the sink reads"

    rest = urlsplit(config.catalog.uri or "")
    assert (config.catalog.type, rest.hostname, rest.port) == ("rest", "rest", _args("rest").port)
    assert rest.path in {"", "/"}, "Iceberg's REST server answers at the root (no path prefix)"
    catalog = config.catalog.model_extra or {}
    endpoint = urlsplit(catalog["s3.endpoint"])
    assert (endpoint.hostname, endpoint.port) == ("s3", _args("s3").port)

    master = urlsplit(config.spark.master or "")
    assert (master.scheme, master.hostname, master.port) == (
        "spark",
        "spark-master",
        _args("spark-master").port,
    )
    for worker in WORKERS:
        assert _services()[worker]["environment"][spark_cluster.MASTER_ENV] == config.spark.master


def test_the_store_the_catalog_and_the_sink_share_one_key_pair() -> None:
    """S3Proxy takes its key pair from the environment; the REST catalog and the sink sign with it."""
    services = _services()
    names = {object_store.ENDPOINT_ENV, object_store.ACCESS_KEY_ENV, object_store.SECRET_KEY_ENV}
    keys = [
        {k: v for k, v in services[name]["environment"].items() if k in names}
        for name in ("s3", "rest", "sink")
    ]
    assert keys[0] == keys[1] == keys[2] and set(keys[0]) == names
    endpoint = urlsplit(keys[0][object_store.ENDPOINT_ENV])
    assert (endpoint.hostname, endpoint.port) == ("s3", _args("s3").port)


def test_the_image_and_the_sink_service_run_the_same_example() -> None:
    """The image's default command is the compose sink's: a real run, never "config not found"."""
    cmd = _exec_form(dict(_dockerfile_instructions(DOCKER / "Dockerfile"))["CMD"])
    assert cmd == _services()["sink"]["command"]
    copied = [shlex.split(a)[-1] for k, a in _dockerfile_instructions(DOCKER / "Dockerfile") if k == "COPY"]
    assert "./docker/sink.yaml" in copied, "the image holds the YAML its default command runs"
