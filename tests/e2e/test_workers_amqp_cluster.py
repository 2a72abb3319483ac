"""End-to-end with both: RabbitMQ as the Celery broker and the mailboxes, runs and
worker registry on the session's Redis Cluster (issue 21, "Must show": the kill -9
chaos tests pass with ``amqp://`` as the broker and the mailboxes on the cluster).

The example run and the kill -9 tests of test_workers.py and test_default_pool.py
run again here (imported, so pytest collects them in this module):
``E2E_BROKER = "amqp"`` gives each deployment a RabbitMQ vhost of its own and
``E2E_STATE = "cluster"`` its ``LATTICE_MAILBOX_URL=redis+cluster://...``
(tests/e2e/conftest.py); the test tools keep their records on the tests' Redis.
"""

from __future__ import annotations

import pytest

from tests.e2e.teams import plan
from tests.e2e.test_default_pool import (  # noqa: F401 (collected again here)
    test_kill9_of_a_worker_with_many_calls_in_flight_recovers_them_all,
)
from tests.e2e.test_workers import (  # noqa: F401 (collected again here)
    corpus,
    test_a_example_team_completes_on_one_worker_process_consuming_every_queue,
    test_c_kill9_while_a_member_works_recovers_after_the_lease,
)

E2E_BROKER = "amqp"
"""The deployments' broker: a RabbitMQ vhost of each test's own."""

E2E_STATE = "cluster"
"""The deployments' mailboxes, runs and registry: the session's Redis Cluster."""

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.cluster, pytest.mark.timeout(180)]


def test_the_broker_is_rabbitmq_and_the_run_lives_on_the_cluster(deployment):
    d = deployment
    worker = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    result = d.client.submit("tests.e2e.teams:team", plan(("worker", "handoff", "ac1"))).wait(timeout=60)
    assert result.result == "final: done:worked[ac1]", result
    assert "transport:   amqp://guest:**@127.0.0.1:5672/" in worker.log()
    record = f"{d.prefix}:run:{{run:{result.run_id}}}"
    assert d.state.exists(record) and not d.redis.exists(record)
    assert d.client.inbox("e2e::worker", "done")
