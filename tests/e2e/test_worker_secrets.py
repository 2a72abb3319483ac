"""A worker on a password-protected Redis: the run works, and the password shows nowhere
in the worker's output (Celery's start-up banner masks it as ``redis://:**@...``), nor
in the ``lattice`` lines of a client pointed at the same URL.

The test starts its own ``redis-server --requirepass`` on a free loopback port (own
process group, stopped by its id).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
import redis
from typer.testing import CliRunner

from lattice_client import LatticeClient
from lattice_client.cli import app
from tests.e2e.conftest import Deployment, free_port, wait_for
from tests.e2e.teams import plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

PASSWORD = "w0rker-Pa55word"


@pytest.fixture
def protected_redis(tmp_path):
    """``redis://:<PASSWORD>@127.0.0.1:<port>/0`` of a Redis this test starts."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD]
        + ["--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    try:

        def up() -> bool:
            with contextlib.suppress(redis.RedisError):
                return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
            return False

        wait_for(up, 20, "the password-protected redis-server")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_worker_on_a_protected_redis_never_shows_the_password(tmp_path, protected_redis):
    d = Deployment(tmp_path)
    d.env["LATTICE_BROKER_URL"] = protected_redis
    d.redis = redis.Redis.from_url(protected_redis, decode_responses=True)
    d._client = LatticeClient(broker_url=protected_redis, key_prefix=d.prefix)
    try:
        worker = d.worker("tests.e2e.teams:team", "--concurrency", "1")
        result = d.client.submit("e2e", plan(("worker", "handoff", "guarded"))).wait(timeout=60)
        assert result.status == "completed", result
        time.sleep(0.5)
        log = worker.log()
        assert "transport:   redis://:**@127.0.0.1:" in log  # Celery's banner names the broker, masked
        assert PASSWORD not in log
        shown = CliRunner().invoke(
            app, ["--broker-url", protected_redis, "--key-prefix", d.prefix, "inbox", "e2e::nobody"]
        )
        assert shown.exit_code == 1 and "unknown mailbox" in shown.output
        assert PASSWORD not in shown.output
        worker.stop()  # the warm shutdown's lines too
    finally:
        d.close()
    assert PASSWORD not in worker.log()
    assert "Warm shutdown" in worker.log()
