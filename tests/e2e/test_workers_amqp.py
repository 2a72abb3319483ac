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

from collections.abc import Iterator

import pytest

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
from tests.support.rabbitmq import amqp_vhost

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


@pytest.fixture
def e2e_broker_url() -> Iterator[str]:
    """A RabbitMQ vhost of the test's own as the deployments' broker."""
    with amqp_vhost("lattice-e2e") as url:
        yield url
