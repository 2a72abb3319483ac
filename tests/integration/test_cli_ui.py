"""``lattice ui`` as a command: it refuses to start without credentials unless
``--unauthenticated`` (loopback only), checks its credentials and ``--drain``
teams before listening, and once up answers 401 without the right password
and 200 with it (on the real Redis, a subprocess in its own process group).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Proc
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]
LATTICE = str(Path(sys.executable).with_name("lattice"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(prefix: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
    env.update({"LATTICE_BROKER_URL": REDIS_URL, "LATTICE_KEY_PREFIX": prefix, "PYTHONPATH": str(REPO)})
    return {**env, **(extra or {})}


def run_ui(prefix: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``lattice ui ARGS`` that is expected to stop by itself (a refusal)."""
    return subprocess.run(
        [LATTICE, "ui", *args], cwd=REPO, env=_env(prefix, env), capture_output=True, text=True, timeout=60
    )


@contextlib.contextmanager
def serving(prefix: str, *args: str, env: dict[str, str] | None = None):
    """``lattice ui ARGS`` running (its own process group, stopped by its id); yields its base URL once it answers."""
    port = free_port()
    with tempfile.TemporaryDirectory() as logs:
        proc = Proc([LATTICE, "ui", "--port", str(port), *args], _env(prefix, env), Path(logs) / "ui.log")
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.alive(), proc.log()
                with contextlib.suppress(httpx.HTTPError):
                    httpx.get(base + "/", timeout=2)
                    break
                assert time.monotonic() < deadline, "lattice ui did not answer"
                time.sleep(0.2)
            yield base
        finally:
            proc.stop(timeout=10)


def test_without_credentials_it_refuses_to_start(prefix):
    done = run_ui(prefix, "--port", str(free_port()))
    assert done.returncode == 1
    assert done.stderr.startswith("error: the operations page needs credentials: --basic-auth USER:PASSWORD")


def test_unauthenticated_listens_on_loopback_only_and_excludes_credentials(prefix):
    wide = run_ui(prefix, "--unauthenticated", "--address", "0.0.0.0")
    assert wide.returncode == 1 and "loopback address only, not '0.0.0.0'" in wide.stderr
    both = run_ui(prefix, "--unauthenticated", env={"LATTICE_UI_BASIC_AUTH": "ops:pw"})
    assert both.returncode == 1 and "exclude each other" in both.stderr
    with serving(prefix, "--unauthenticated") as base:
        page = httpx.get(base + "/")
        assert page.status_code == 200 and "signed in as <strong>anonymous</strong>" in page.text


def test_bad_credentials_are_refused_without_echoing_the_password(prefix):
    done = run_ui(prefix, "--basic-auth", "ops:pw1,viewer:")
    assert done.returncode == 1 and "an entry for user 'viewer' has an empty password" in done.stderr
    assert "pw1" not in done.stderr


def test_a_drain_team_that_does_not_import_is_one_error_line(prefix):
    done = run_ui(prefix, "--basic-auth", "ops:pw", "--drain", "no_such_module_xyz:team")
    assert done.returncode == 1 and done.stderr.startswith("error:"), done.stderr
    assert "no_such_module_xyz" in done.stderr and "Traceback" not in done.stderr


def test_a_busy_port_is_one_error_line(prefix):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_ui(prefix, "--port", str(port), "--basic-auth", "ops:pw")
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: the operations page cannot listen on 127.0.0.1:{port}")
    assert "another server on that port? choose --port or --address" in done.stderr, done.stderr


def test_a_wrong_password_gets_401_and_the_right_one_200_on_the_root(prefix):
    with serving(prefix, env={"LATTICE_UI_BASIC_AUTH": "ops:s3cret"}) as base:
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/", auth=("ops", "nope")).status_code == 401
        ok = httpx.get(base + "/", auth=("ops", "s3cret"))
        assert ok.status_code == 200 and "<h1>Runs</h1>" in ok.text
