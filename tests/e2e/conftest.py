"""End-to-end fixtures: real ``lattice worker`` processes on the real Redis.

Each test gets a :class:`Deployment` on the broker the ``e2e_broker_url`` fixture
names (the tests' Redis; a RabbitMQ vhost in a module setting ``E2E_BROKER =
"amqp"``, e.g. tests/e2e/test_workers_amqp.py, and the mailboxes, runs and registry stay on the
tests' Redis): its own key prefix (``test-<uuid>``, so
queues, mailboxes, runs and Celery's own keys never meet another test's), a
client in the test process, and a way to start ``lattice worker ...``
subprocesses -- each in its own process group (``start_new_session``), logging
to a file, stopped by process-group id (:meth:`Proc.stop`: ``SIGTERM``, then
``SIGKILL``) or killed with ``SIGKILL`` on purpose (:meth:`Proc.kill9`). When the
test ends, the processes still running are killed by process group
(``SIGKILL``): a warm shutdown waits about a second per worker (kombu closes the
channel only after its pending ``BRPOP`` returns), and the test is over. A test
that checks what a warm shutdown does calls :meth:`Proc.stop` itself. Every key
under the prefix is deleted afterwards; the database is never flushed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from lattice_client import LatticeClient
from lattice_client.settings import LatticeSettings, get_settings, is_amqp_url
from lattice_mailbox.connections import sync_redis
from tests.support import rabbitmq
from tests.support.services import REDIS_URL, TEST_REDIS_ENV

REPO = Path(__file__).resolve().parents[2]
LATTICE = str(Path(sys.executable).with_name("lattice"))
FAST_WORKER_ARGS = ("--without-mingle", "--without-gossip")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A subprocess in its own process group, logging to ``log_path``."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pgid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_log(self, pattern: str, timeout: float = 30, count: int = 1) -> list[str]:
        """Wait until ``pattern`` (a regex) matches ``count`` times in the log."""

        def found() -> list[str] | None:
            hits = re.findall(pattern, self.log())
            if len(hits) >= count:
                return hits
            if not self.alive():
                raise AssertionError(f"{self.argv} exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            return None

        try:
            return wait_for(found, timeout, f"{pattern!r} x{count} in the log of {self.argv[1:4]}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- log ---\n{self.log()[-4000:]}") from None

    def kill9(self) -> None:
        """SIGKILL the whole process group (a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the process group (warm shutdown), SIGKILL after ``timeout`` s."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)  # stray pool children
        self._log.close()


class Deployment:
    """One isolated deployment (key prefix) with its workers and a client."""

    def __init__(
        self, tmp_path: Path, broker_url: str = REDIS_URL, cluster_url: str | None = None, **settings: Any
    ) -> None:
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.broker_url = broker_url
        self.amqp = is_amqp_url(broker_url)
        self.cluster_url = cluster_url
        # with RabbitMQ the mailboxes, runs and registry stay on the tests' Redis; with a
        # cluster URL they go to that Redis Cluster (the broker and the test tools' records
        # stay on the tests' Redis)
        self._mailbox = {"mailbox_url": cluster_url or REDIS_URL} if self.amqp or cluster_url else {}
        self.tmp_path = tmp_path
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LATTICE_", "ANTHROPIC_", "DEEPSEEK_"))
        }
        self.env.update(
            {
                "LATTICE_BROKER_URL": broker_url,
                **{f"LATTICE_{k.upper()}": v for k, v in self._mailbox.items()},
                "LATTICE_KEY_PREFIX": self.prefix,
                # the test tools' records go to the tests' Redis (tests/support/services.py
                # deployment_redis_url) when neither the broker nor the mailboxes are one Redis
                TEST_REDIS_ENV: REDIS_URL,
                "LATTICE_LEASE_SECONDS": "5",
                "LATTICE_REAPER_INTERVAL_SECONDS": "0.5",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(REPO),
            }
        )
        self.env.update({f"LATTICE_{k.upper()}": str(v) for k, v in settings.items()})
        self.procs: list[Proc] = []
        self.redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.state = sync_redis(cluster_url, decode_responses=True) if cluster_url else self.redis
        """A blocking client of the Redis holding the runs and mailboxes (:attr:`state_url`)."""
        self._client: LatticeClient | None = None

    @property
    def client(self) -> LatticeClient:
        if self._client is None:
            self._client = LatticeClient(broker_url=self.broker_url, key_prefix=self.prefix, **self._mailbox)
        return self._client

    @property
    def settings(self) -> LatticeSettings:
        """The deployment's settings (broker, mailboxes and key prefix) for a client or app in the test."""
        return get_settings(broker_url=self.broker_url, key_prefix=self.prefix, **self._mailbox)

    @property
    def state_url(self) -> str:
        """The Redis of the deployment's runs and registry (the tests' Redis on either
        broker, or the Redis Cluster the deployment was given)."""
        return self.cluster_url or REDIS_URL

    def start(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(argv, {**self.env, **(env or {})}, self.tmp_path / f"{name}-{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    def worker(
        self, team_ref: str, *args: str, env: dict[str, str] | None = None, ready: bool = True
    ) -> Proc:
        """Start ``lattice worker TEAM_REF ARGS...`` and wait until Celery says it is ready."""
        proc = self.start([LATTICE, "worker", team_ref, *args, *FAST_WORKER_ARGS], "worker", env)
        if ready:
            proc.wait_log(r"ready\.", timeout=45)
        return proc

    def executions(self, task: str) -> int:
        """How many times the ``work`` tool ran ``task`` (see tests/e2e/teams.py)."""
        return int(self.redis.get(f"{self.prefix}:test:exec:{task}") or 0)

    def work_log(self) -> list[str]:
        return self.redis.lrange(f"{self.prefix}:test:log", 0, -1)

    def queue_length(self, queue: str) -> int:
        """Task messages waiting on the broker queue ``queue`` (not those delivered and unacked)."""
        if self.amqp:
            return rabbitmq.queue_length(self.broker_url, queue)
        return int(self.redis.llen(f"{self.prefix}:{queue}"))

    def redeliver(self, queue: str) -> None:
        """The broker delivers the one message waiting on ``queue`` twice: the same raw message twice."""
        if self.amqp:
            rabbitmq.duplicate_message(self.broker_url, queue)
            return
        [raw] = self.redis.lrange(f"{self.prefix}:{queue}", 0, -1)
        self.redis.lpush(f"{self.prefix}:{queue}", raw)

    def close(self) -> None:
        for proc in self.procs:  # the test is over: no warm shutdown (see the module docstring)
            with contextlib.suppress(Exception):
                proc.kill9()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        keys = list(self.redis.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self.redis.delete(*keys)
        self.redis.close()
        if self.state is not self.redis:  # a cluster: its keys lie in many slots, one DEL each
            for key in list(self.state.scan_iter(match=f"{self.prefix}:*", count=1000)):
                self.state.delete(key)
            self.state.close()


@pytest.fixture
def e2e_broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The broker of the deployments: the tests' Redis, or a RabbitMQ vhost of the
    test's own (tests/support/rabbitmq.py) in a module that sets ``E2E_BROKER = "amqp"``."""
    if getattr(request.module, "E2E_BROKER", "redis") == "amqp":
        with rabbitmq.amqp_vhost("lattice-e2e") as url:
            yield url
    else:
        yield REDIS_URL


@pytest.fixture
def e2e_cluster_url(request: pytest.FixtureRequest) -> str | None:
    """The Redis Cluster of the deployments' mailboxes, runs and registry (the
    session's ``redis_cluster``) in a module that sets ``E2E_STATE = "cluster"``
    (e.g. tests/e2e/test_workers_cluster.py), else ``None`` (they stay on the broker's Redis)."""
    if getattr(request.module, "E2E_STATE", "redis") == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return None


@pytest.fixture
def deployment(tmp_path: Path, e2e_broker_url: str, e2e_cluster_url: str | None) -> Iterator[Deployment]:
    d = Deployment(tmp_path, e2e_broker_url, e2e_cluster_url)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def deployment_factory(
    tmp_path: Path, e2e_broker_url: str, e2e_cluster_url: str | None
) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(**settings: Any) -> Deployment:
        d = Deployment(tmp_path, e2e_broker_url, e2e_cluster_url, **settings)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.close()
