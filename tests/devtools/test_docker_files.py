"""No Docker engine runs here, so the image and compose definitions are checked statically: every
command they run parses with the real CLI, every file they copy exists, and the Kafka service is
configured for transactions on one node."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from fanout_sink.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


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


def test_dockerfile_copies_existing_files_and_runs_real_cli_commands() -> None:
    instructions = _dockerfile_instructions(DOCKER / "Dockerfile")
    kinds = [kind for kind, _ in instructions]
    assert kinds[0] == "FROM" and "ENTRYPOINT" in kinds and "CMD" in kinds
    for kind, arguments in instructions:
        if kind == "COPY":
            *sources, _destination = shlex.split(arguments)
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    entrypoint = _exec_form(dict(instructions)["ENTRYPOINT"])
    assert entrypoint == ["fanout-sink"], "the image's entry point is the project's console script"
    build_parser().parse_args(_exec_form(dict(instructions)["CMD"]))
    run_lines = [arguments for kind, arguments in instructions if kind == "RUN"]
    fanout_calls = [part.strip() for line in run_lines for part in line.split("&&") if "fanout-sink " in part]
    for call in fanout_calls:
        build_parser().parse_args(shlex.split(call)[1:])
    assert fanout_calls, "the image fetches the connector jars at build time"


def test_compose_builds_the_app_and_configures_kafka_for_transactions_on_one_node() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"kafka", "app"}

    app = services["app"]
    context = (DOCKER / app["build"]["context"]).resolve()
    assert (context / app["build"]["dockerfile"]).is_file()
    build_parser().parse_args(app["command"])
    assert app["depends_on"]["kafka"]["condition"] == "service_healthy"
    for volume in app.get("volumes", []):
        name = volume.split(":", 1)[0]
        assert name in compose.get("volumes", {}) or (DOCKER / name).exists(), f"volume {name} is undefined"
    bootstrap = app["command"][app["command"].index("--bootstrap-servers") + 1]
    assert bootstrap == "kafka:9092"

    env = {key: str(value) for key, value in services["kafka"]["environment"].items()}
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters.startswith(f"{env['KAFKA_NODE_ID']}@kafka:"), "the quorum voter is this node"
    assert voters.rsplit(":", 1)[1] in env["KAFKA_LISTENERS"]
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", f"{key} must be 1 on a one-node cluster or transactions hang"
    assert services["kafka"]["healthcheck"]["test"][0] == "CMD-SHELL"


@pytest.mark.parametrize("section", ["services", "volumes"])
def test_compose_has_no_unknown_top_level_keys(section: str) -> None:
    compose = _compose()
    assert set(compose) <= {"name", "services", "volumes", "networks"}
    assert isinstance(compose[section], dict)
