"""compose/docker-compose.yml and compose/Dockerfile: structure, and every command
a service runs is a real ``lattice`` command that works here (run with ``--help``)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
WORKER_SERVICES = {"lead": "lead", "searcher": "searcher", "counter": "counter"}
LATTICE_SERVICES = [*WORKER_SERVICES, "flower"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def command_argv(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_services_and_the_shared_environment(compose):
    assert set(compose["services"]) == {"redis", *LATTICE_SERVICES}
    env = compose["x-lattice-env"]
    assert env["LATTICE_BROKER_URL"] == "redis://redis:6379/0"
    for name in LATTICE_SERVICES:
        service = compose["services"][name]
        assert service["environment"]["LATTICE_BROKER_URL"] == "redis://redis:6379/0", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert service["build"]["dockerfile"] == "compose/Dockerfile"
        assert (COMPOSE.parent / service["build"]["context"]).resolve() == ROOT


def test_redis_and_flower_have_healthchecks(compose):
    redis_check = compose["services"]["redis"]["healthcheck"]["test"]
    assert redis_check[-2:] == ["redis-cli", "ping"]
    flower = compose["services"]["flower"]
    assert "5555/healthcheck" in " ".join(flower["healthcheck"]["test"])
    assert any(str(p).endswith(":5555") for p in flower["ports"])


def test_one_worker_service_per_queue_of_the_example_team_and_scalable(compose):
    for name, member in WORKER_SERVICES.items():
        service = compose["services"][name]
        assert command_argv(service) == [
            "lattice",
            "worker",
            "lattice_worker.examples.team:team",
            "--member",
            member,
        ]
        # no published ports and no fixed container name, so `--scale searcher=3` works
        assert "ports" not in service and "container_name" not in service, name
    assert command_argv(compose["services"]["flower"]) == [
        "lattice",
        "flower",
        "--address",
        "0.0.0.0",
        "--port",
        "5555",
    ]


def test_dockerfile_installs_the_package_on_python_3_11_slim():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    for source in re.findall(r"^COPY (.+?) \S+$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"Dockerfile copies a missing path: {path}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("service", LATTICE_SERVICES)
def test_every_service_command_works_here(compose, service):
    argv = command_argv(compose["services"][service])
    assert argv[0] in ("lattice", "celery")
    executable = shutil.which(argv[0])
    assert executable, f"{argv[0]} is not on PATH"
    result = subprocess.run(
        [executable, *argv[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    help_text = result.stdout
    for option in [a.split("=", 1)[0] for a in argv if a.startswith("-")]:
        assert option in help_text, f"{service}: option {option} is not in `{' '.join(argv[:2])} --help`"
