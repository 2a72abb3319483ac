"""End-to-end on RabbitMQ: the worker tests of test_workers.py and the kill -9
tests of test_default_pool.py again, with ``amqp://`` as the Celery broker.

Issue 21 item 1. Every test here is one of those modules' own (imported, so
pytest collects it again in this module); the ``e2e_broker_url`` fixture below
gives each a private RabbitMQ vhost (tests/support/rabbitmq.py), while the
mailboxes, runs and worker registry stay on the tests' Redis
(``LATTICE_MAILBOX_URL``). Leases, resume, cancel, heartbeats and kill -9
recovery must behave as on Redis: all runs complete, none lost, none doubled.
A kill -9 closes the worker's AMQP connection, so RabbitMQ puts its unacked
task messages back at once (late acks); the redelivered step finds its claim
held and the reaper requeues the mailbox message after the lease, as on Redis.
"""

from __future__ import annotations

import pytest

from lattice_client.celery_config import queue_name
from tests.e2e.conftest import LATTICE, wait_for
from tests.e2e.teams import plan
from tests.e2e.test_workers import run_status
from tests.e2e.worker_suite import *  # noqa: F403 (collected again here, on RabbitMQ)
from tests.support.rabbitmq import queue_types

E2E_BROKER = "amqp"
"""The deployments' broker: a RabbitMQ vhost of each test's own (tests/e2e/conftest.py)."""

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


def test_team_queues_are_quorum_queues_and_the_worker_reports_its_amqp_broker(deployment, e2e_broker_url):
    d = deployment
    worker = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    result = d.client.submit("tests.e2e.teams:team", plan(("worker", "handoff", "q1"))).wait(timeout=60)
    assert result.status == "completed", result
    log = worker.log()
    assert "transport:   amqp://guest:**@127.0.0.1:5672/" in log  # Celery's banner: the broker is RabbitMQ
    assert "Global QoS is disabled" in log  # Celery found the quorum queues (they refuse global QoS)
    assert "native delayed delivery do not support" not in log  # topic exchanges
    # every queue it binds exists: the app of a worker knows only the queues it consumes
    # (before, the undeclared default queue failed the bind at every start)
    assert "Failed to bind queue" not in log and "Native delayed delivery will not be available" not in log
    types = queue_types(e2e_broker_url)
    for member in ("lead", "worker", "other"):
        assert types[queue_name(d.prefix, "e2e", member)] == "quorum", types
    # the mailboxes, runs and registry stayed on Redis; RabbitMQ holds no queue of ours left with work
    assert d.redis.exists(f"{d.prefix}:run:{{run:{result.run_id}}}")
    assert all(d.queue_length(queue_name(d.prefix, "e2e", m)) == 0 for m in ("lead", "worker", "other"))


def test_a_drain_by_hand_completes_the_run_and_its_resume_goes_through_rabbitmq(deployment):
    """``lattice drain`` with the deployment's settings: the member's message is
    done in the CLI process (mailboxes on Redis) and the run's ``resume_lead``
    goes through RabbitMQ to the lead worker."""
    d = deployment
    d.worker("tests.e2e.teams:team", "--member", "lead", "--concurrency", "1")
    handle = d.client.submit("tests.e2e.teams:team", plan(("worker", "handoff", "drained by hand")))
    wait_for(lambda: run_status(d, handle.run_id) == "suspended", 30, "the run to wait for its member")
    drain = d.start([LATTICE, "drain", "tests.e2e.teams:team", "--member", "worker"], "drain")
    assert drain.proc.wait(60) == 0, drain.log()
    assert handle.wait(timeout=60).result == "final: done:worked[drained by hand]"
    assert d.executions("drained by hand") == 1
    assert [m.status.value for m in d.client.inbox("e2e::worker", "all")] == ["done"]
