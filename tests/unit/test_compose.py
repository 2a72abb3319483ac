"""compose/docker-compose.yml and compose/Dockerfile: structure, and every command
a service runs is a real ``lattice`` command that works here (run with ``--help``);
Redis's host port and the host CLI's broker from one variable (``LATTICE_REDIS_PORT``);
the image carries the PostgreSQL driver; Flower's credentials come from the environment."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from lattice_client.settings import get_settings

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
    assert re.search(r'^RUN pip install "\.\[', text, re.M)
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


def test_redis_host_port_and_the_host_cli_follow_one_variable(compose, monkeypatch):
    assert compose["services"]["redis"]["ports"] == ["127.0.0.1:${LATTICE_REDIS_PORT:-6379}:6379"]
    assert "LATTICE_REDIS_PORT" in COMPOSE.read_text().split("services:")[0]  # documented in the header
    monkeypatch.delenv("LATTICE_BROKER_URL", raising=False)
    monkeypatch.delenv("LATTICE_MAILBOX_URL", raising=False)
    monkeypatch.delenv("LATTICE_REDIS_PORT", raising=False)
    assert get_settings().broker_url == "redis://127.0.0.1:6379/0"  # the documented default
    monkeypatch.setenv("LATTICE_REDIS_PORT", "6380")
    moved = get_settings()
    assert (moved.broker_url, moved.mailbox_url) == ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0")
    monkeypatch.setenv("LATTICE_BROKER_URL", "redis://elsewhere:7000/1")  # an explicit URL wins
    assert get_settings().broker_url == "redis://elsewhere:7000/1"
    monkeypatch.setenv("LATTICE_REDIS_PORT", "not-a-port")
    with pytest.raises(ValueError, match="redis_port"):
        get_settings()


def test_the_image_installs_the_worker_extra_and_the_postgresql_driver():
    text = DOCKERFILE.read_text()
    install = re.search(r'^RUN pip install "\.\[([a-z,]+)\]"', text, re.M)
    assert install, text
    extras = set(install.group(1).split(","))
    assert {"worker", "postgres"} <= extras
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("psycopg") for d in declared["postgres"])
    assert any(d.startswith("anthropic") for d in declared["worker"])


def test_flower_takes_its_credentials_from_the_environment_with_no_default(compose):
    env = compose["services"]["flower"]["environment"]
    assert env["FLOWER_BASIC_AUTH"] == "${FLOWER_BASIC_AUTH:-}"
    for name in ("FLOWER_AUTH", "FLOWER_OAUTH2_KEY", "FLOWER_OAUTH2_SECRET", "FLOWER_OAUTH2_REDIRECT_URI"):
        assert env[name] == f"${{{name}:-}}"
    assert env["LATTICE_BROKER_URL"] == "redis://redis:6379/0"  # the shared environment is merged in
    assert not re.search(
        r"^\s*FLOWER_BASIC_AUTH:\s*(?!\$\{FLOWER_BASIC_AUTH:-\})\S", COMPOSE.read_text(), re.M
    )
    assert not any(k.startswith("FLOWER_") for k in compose["x-lattice-env"])  # workers get none


@pytest.mark.timeout(60)
def test_the_flower_service_refuses_to_start_without_credentials(compose):
    argv = command_argv(compose["services"]["flower"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LATTICE_", "FLOWER_"))}
    env.update({"FLOWER_BASIC_AUTH": "", "LATTICE_BROKER_URL": "redis://127.0.0.1:1/0"})  # compose's default
    result = subprocess.run(
        [shutil.which(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=30, env=env
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: Flower needs credentials"), result.stderr
