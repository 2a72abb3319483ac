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
from tests.e2e.teams import plan
from tests.e2e.test_default_pool import (  # noqa: F401 (collected again here, on RabbitMQ)
    test_cancel_stops_a_member_working_on_the_default_pool,
    test_kill9_of_a_worker_with_many_calls_in_flight_recovers_them_all,
)
from tests.e2e.test_workers import (  # noqa: F401 (collected again here, on RabbitMQ)
    corpus,
    test_a_example_team_completes_on_one_worker_process_consuming_every_queue,
    test_b_two_workers_on_one_member_queue_overlap_that_members_work_items,
    test_c_kill9_while_a_member_works_recovers_after_the_lease,
    test_d_duplicated_doorbell_and_redelivered_messages_execute_once,
    test_e_cancel_with_no_worker_online_then_the_work_never_runs,
    test_f_a_pickled_task_message_is_refused_and_nothing_runs,
)
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
    types = queue_types(e2e_broker_url)
    for member in ("lead", "worker", "other"):
        assert types[queue_name(d.prefix, "e2e", member)] == "quorum", types
    # the mailboxes, runs and registry stayed on Redis; RabbitMQ holds no queue of ours left with work
    assert d.redis.exists(f"{d.prefix}:run:{{run:{result.run_id}}}")
    assert all(d.queue_length(queue_name(d.prefix, "e2e", m)) == 0 for m in ("lead", "worker", "other"))
