"""``lattice flower`` starts the real Flower on our Celery configuration.

Flower runs as a subprocess (its own process group, stopped by group id) with
credentials from ``FLOWER_BASIC_AUTH`` or ``--basic-auth``; a real Celery worker
(solo pool, in a thread) serves the same key prefix. Flower's HTTP API must
list that worker and the task it ran, and refuse requests without credentials;
without credentials ``lattice flower`` refuses to start unless ``--unauthenticated``
(loopback only); a busy port is one error line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from lattice_client.celery_config import make_celery_app, queue_name
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")


def test_lattice_flower_serves_the_api_with_basic_auth(prefix):
    port = free_port()
    flower = start_flower(prefix, "--port", str(port), env={"FLOWER_BASIC_AUTH": "ops:s3cret"})
    app = make_celery_app(settings_for(prefix))

    @app.task(name="lattice.test_flower_noop", shared=False)
    def noop(tag: str) -> str:
        return tag

    queue = queue_name(prefix, "team", "lead")
    auth = ("ops", "s3cret")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base)
        assert httpx.get(f"{base}/api/workers", timeout=5).status_code == 401  # credentials required
        with start_worker(
            app, pool="solo", perform_ping_check=False, queues=[queue], loglevel="WARNING"
        ) as worker:
            app.send_task("lattice.test_flower_noop", args=["hello"], queue=queue)

            def workers() -> dict:
                response = httpx.get(f"{base}/api/workers", params={"refresh": "1"}, auth=auth, timeout=10)
                assert response.status_code == 200
                return response.json()

            listed = wait_until(lambda: worker.hostname in workers(), 30, "the worker in /api/workers")
            assert listed

            def tasks() -> list:
                response = httpx.get(f"{base}/api/tasks", auth=auth, timeout=10)
                assert response.status_code == 200
                return [
                    t
                    for t in response.json().values()
                    if t.get("name") == "lattice.test_flower_noop" and t.get("state") == "SUCCESS"
                ]

            [task] = wait_until(tasks, 30, "the task in /api/tasks")
            assert task["worker"] == worker.hostname
    finally:
        output = stop_flower(flower)
    assert "Traceback" not in output, output


def start_flower(prefix: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``lattice flower --app lattice_flower_app:app ARGS`` in its own process group."""
    full_env = {
        **os.environ,
        "LATTICE_BROKER_URL": REDIS_URL,
        "LATTICE_KEY_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    lattice = [sys.executable, "-c", "from lattice_client.cli import app; app()"]
    return subprocess.Popen(
        [*lattice, "flower", "--app", "lattice_flower_app:app", "--persistent=False", *args],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_flower(flower: subprocess.Popen) -> str:
    if flower.poll() is None:
        os.killpg(flower.pid, signal.SIGTERM)
    try:
        return flower.communicate(timeout=20)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(flower.pid, signal.SIGKILL)
        return flower.communicate()[0].decode(errors="replace")


def wait_healthy(base: str) -> None:
    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthcheck", timeout=1).text == "OK"
        except httpx.HTTPError:
            return False

    wait_until(healthy, 30, "Flower to answer /healthcheck")


def test_basic_auth_flag_protects_ui_and_api_and_stays_off_the_command_line(prefix):
    port = free_port()
    flower = start_flower(prefix, "--port", str(port), "--basic-auth", "ops:fl0wer-s3cret")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base)
        for path in ("/", "/workers", "/api/workers", "/api/tasks"):
            assert httpx.get(f"{base}{path}", timeout=5).status_code == 401, path
            assert httpx.get(f"{base}{path}", auth=("ops", "wrong"), timeout=5).status_code == 401, path
        assert httpx.get(f"{base}/api/workers", auth=("ops", "fl0wer-s3cret"), timeout=10).status_code == 200
        assert httpx.get(f"{base}/", auth=("ops", "fl0wer-s3cret"), timeout=10).status_code == 200
        # the exec'd Flower (same pid) got the password through its environment, not its argv
        cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes().decode(errors="replace")
        assert "celery" in cmdline and "flower" in cmdline
        assert "fl0wer-s3cret" not in cmdline
    finally:
        output = stop_flower(flower)
    assert "Traceback" not in output, output
    assert "fl0wer-s3cret" not in output


def test_unauthenticated_flower_serves_loopback_only_without_credentials(prefix):
    port = free_port()
    flower = start_flower(prefix, "--port", str(port), "--unauthenticated")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base)
        assert httpx.get(f"{base}/api/workers", timeout=10).status_code == 200
        cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--address=127.0.0.1" in cmdline
    finally:
        output = stop_flower(flower)
    assert "Traceback" not in output, output


def test_flower_without_credentials_refuses_to_start(prefix):
    flower = start_flower(prefix, "--port", str(free_port()))
    output = flower.communicate(timeout=30)[0].decode(errors="replace")
    assert flower.returncode == 1
    assert output.strip().splitlines() == [output.strip()]  # one line
    assert output.startswith("error: Flower needs credentials") and "--unauthenticated" in output


def test_flower_on_a_busy_port_fails_with_one_line(prefix):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        flower = start_flower(prefix, "--port", str(port), "--basic-auth", "ops:pw-1234")
        output = flower.communicate(timeout=30)[0].decode(errors="replace")
    assert flower.returncode == 1, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"error: Flower cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "Traceback" not in output
