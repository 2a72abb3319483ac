"""The thin client install: the wheel built from this checkout, installed alone (with its
own dependencies from the package index) into a fresh virtualenv, has none of the worker's
heavy packages, and its ``lattice`` CLI and ``LatticeClient`` submit and wait on runs that a
worker of the full install (this checkout's ``lattice worker``) serves; a worker-side
command there, or a SQL mailbox URL, says which extra to install.

Bounded in time: one wheel build, one virtualenv without pip (this interpreter's pip
installs into it), one worker. Takes about 30-60 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Deployment
from tests.e2e.teams import plan
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]

HEAVY = (
    "anthropic",
    "mcp",
    "flower",
    "tornado",
    "sqlalchemy",
    "psycopg",
    "jsonschema",
    "hiredis",
    "httpx",
    "httpx2",
    "wcmatch",
)
"""Packages of the worker extra (and their big dependencies) a thin client must not have."""


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 150
) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )


@pytest.fixture(scope="module")
def thin_venv(tmp_path_factory) -> Path:
    """A virtualenv holding the built wheel and only its (thin) dependencies."""
    root = tmp_path_factory.mktemp("thin")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("lattice_client", "lattice_mailbox", "lattice_worker"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = run([*pip, "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)], cwd=root, env=env)
    assert built.returncode == 0, built.stderr
    [wheel] = (root / "dist").glob("agent_lattice-*.whl")
    venv = root / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root, env=env)
    assert made.returncode == 0, made.stderr
    installed = run(
        # --no-compile: byte-compiling the installed packages took a few seconds and is not tested here
        [*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile", str(wheel)],
        cwd=root,
        env=env,
    )
    assert installed.returncode == 0, installed.stderr
    return venv


def thin_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LATTICE_", "PYTHON"))}


def test_the_thin_client_has_no_worker_packages_and_serves_runs_of_a_full_worker(thin_venv, tmp_path):
    python, lattice = str(thin_venv / "bin" / "python"), str(thin_venv / "bin" / "lattice")
    env = thin_env()
    probe = run(
        [
            python,
            "-c",
            "import importlib.util, lattice_client; "
            f"print(lattice_client.__file__); print([m for m in {HEAVY!r} if importlib.util.find_spec(m)])",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    where, found = probe.stdout.splitlines()
    assert where.startswith(str(thin_venv)), where  # the installed wheel, not this checkout
    assert found == "[]", f"heavy packages in the thin client install: {found}"

    extra = run([lattice, "worker", "tests.e2e.teams:team"], cwd=tmp_path, env=env)
    assert extra.returncode == 1
    lines = extra.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the worker extra: pip install 'agent-lattice[worker]'" in lines[0], (
        extra
    )

    page = run([lattice, "ui", "--unauthenticated"], cwd=tmp_path, env=env)
    assert page.returncode == 1 and "needs the ui extra: pip install 'agent-lattice[ui]'" in page.stderr, page
    shipped = run(  # the page's templates and static files are in the wheel
        [
            python,
            "-c",
            "import pathlib, lattice_client; ui = pathlib.Path(lattice_client.__file__).parent / 'ui'; "
            "print((ui / 'templates' / 'run.html').is_file() and (ui / 'static' / 'ui.js').is_file())",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert shipped.stdout.strip() == "True", shipped

    for url, extra_name in (("postgresql://app@127.0.0.1:1/db", "postgres"), ("sqlite:///x.db", "sql")):
        sql = run([lattice, "--mailbox-url", url, "inbox", "demo::searcher"], cwd=tmp_path, env=env)
        assert sql.returncode == 1
        assert f"mailbox needs SQLAlchemy (pip install 'agent-lattice[{extra_name}]')" in sql.stderr, (
            sql.stderr
        )

    d = Deployment(tmp_path)
    try:
        d.worker("tests.e2e.teams:team", "--concurrency", "1")  # this checkout: the full install
        base = [lattice, "--broker-url", REDIS_URL, "--key-prefix", d.prefix]
        submitted = run(
            [*base, "submit", "e2e", plan(("worker", "handoff", "thin")), "--wait", "--timeout", "60"],
            cwd=tmp_path,
            env=env,
        )
        assert submitted.returncode == 0, (submitted.stdout, submitted.stderr)
        assert ": completed" in submitted.stdout
        code = (
            "from lattice_client import LatticeClient\n"
            f"with LatticeClient({REDIS_URL!r}, key_prefix={d.prefix!r}) as client:\n"
            f"    result = client.submit('e2e', {plan(('other', 'ask', 'from python'))!r}).wait(timeout=60)\n"
            "    print(result.status)\n"
        )
        from_python = run([python, "-c", code], cwd=tmp_path, env=env)
        assert from_python.returncode == 0, from_python.stderr
        assert from_python.stdout.strip() == "completed"
        status = run([*base, "status", "e2e"], cwd=tmp_path, env={**env, "COLUMNS": "200"})
        assert status.returncode == 0 and "e2e::worker" in status.stdout, status.stderr
    finally:
        d.close()
