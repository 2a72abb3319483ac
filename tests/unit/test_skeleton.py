"""The repository skeleton of issue 2 ("Build" 1): one distribution holding the three
packages with a ``lattice`` console script, typed packages, separate test/bench
extras, ruff configured, and a README whose set-up is two commands, the second
being what ``.ci/run`` runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lattice_worker", "lattice_client", "lattice_mailbox")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set-up: two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the set-up section has no bash block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_one_distribution_with_the_three_packages_and_the_lattice_script():
    project = pyproject()["project"]
    assert project["name"] == "agent-lattice"
    assert project["requires-python"] == ">=3.11"
    assert project["scripts"]["lattice"] == "lattice_client.cli:app"
    found = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in PACKAGES:
        assert f"{package}*" in found
        assert (ROOT / package / "py.typed").is_file()
        assert "py.typed" in pyproject()["tool"]["setuptools"]["package-data"][package]


def test_thin_runtime_dependencies_a_worker_extra_and_separate_test_and_bench_extras():
    project = pyproject()["project"]
    runtime = " ".join(project["dependencies"])
    for needed in ("pydantic", "pydantic-settings", "celery[redis]", "kombu", "redis", "typer", "rich"):
        assert needed in runtime
    for heavy in ("anthropic", "mcp", "flower", "sqlmodel", "sqlalchemy", "psycopg", "tenacity", "hiredis"):
        assert heavy not in runtime, heavy  # the plain install is the thin client
    extras = project["optional-dependencies"]
    worker = " ".join(extras["worker"])
    for needed in ("anthropic", "mcp", "flower", "sqlalchemy"):
        assert needed in worker
    assert any(d.startswith("psycopg") for d in extras["postgres"])
    assert "agent-lattice[worker,postgres,ui]" in extras["test"]  # the README's set-up installs .[test]
    for needed in ("starlette", "jinja2", "uvicorn", "python-multipart"):  # the operations page
        assert any(d.startswith(needed) for d in extras["ui"]), needed
    assert "starlette" not in runtime and "jinja2" not in runtime
    assert any(d.startswith("pytest") for d in extras["test"])
    assert any(d.startswith("openai-agents") for d in extras["bench"])
    assert "openai-agents" not in runtime and "pytest" not in runtime
    assert "tenacity" not in (ROOT / "pyproject.toml").read_text()
    assert "ruff" in pyproject()["tool"]


def test_readme_set_up_is_two_commands_and_ci_runs_the_test_command():
    commands = setup_commands()
    assert len(commands) == 2
    install, run_tests = commands
    assert install.startswith("pip install -e") and "lattice demo" in install
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.splitlines()[-1].strip() == f"exec bash {run_tests}"
    assert (ROOT / run_tests).is_file()
