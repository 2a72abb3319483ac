"""``lattice flower`` starts the real Flower on our Celery configuration.

Flower runs as a subprocess (its own process group, stopped by group id) with
``FLOWER_BASIC_AUTH`` passed through the environment; a real Celery worker
(solo pool, in a thread) serves the same key prefix. Flower's HTTP API must
list that worker and the task it ran, and refuse requests without credentials.
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
from lattice_client.settings import get_settings
from tests.support.services import REDIS_URL

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
    env = {
        **os.environ,
        "LATTICE_BROKER_URL": REDIS_URL,
        "LATTICE_KEY_PREFIX": prefix,
        "FLOWER_BASIC_AUTH": "ops:s3cret",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    lattice = [sys.executable, "-c", "from lattice_client.cli import app; app()"]
    flower = subprocess.Popen(
        [*lattice, "flower", "--app", "lattice_flower_app:app", "--port", str(port), "--persistent=False"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    app = make_celery_app(get_settings(broker_url=REDIS_URL, key_prefix=prefix))

    @app.task(name="lattice.test_flower_noop", shared=False)
    def noop(tag: str) -> str:
        return tag

    queue = queue_name(prefix, "team", "lead")
    auth = ("ops", "s3cret")
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthcheck", timeout=1).text == "OK"
            except httpx.HTTPError:
                return False

        wait_until(healthy, 30, "Flower to answer /healthcheck")
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
        if flower.poll() is None:
            os.killpg(flower.pid, signal.SIGTERM)
        try:
            output = flower.communicate(timeout=20)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, signal.SIGKILL)
            output = flower.communicate()[0].decode(errors="replace")
    assert "Traceback" not in output, output
