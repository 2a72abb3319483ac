"""End-to-end (g), (h) on RabbitMQ: Flower started by ``lattice flower`` sees the
workers and every step when the broker is ``amqp://`` (issue 21 item 1).

The tests are test_flower.py's own, collected again here with a private
RabbitMQ vhost as the broker (tests/support/rabbitmq.py); mailboxes, runs and
the registry stay on the tests' Redis.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_flower import (  # noqa: F401 (collected again here, on RabbitMQ)
    test_g_flower_lists_the_workers_and_deliver_tasks,
    test_h_beside_an_all_queues_worker_two_member_workers_share_its_work_and_flower_shows_each_step,
)

E2E_BROKER = "amqp"
"""The deployments' broker: a RabbitMQ vhost of each test's own (tests/e2e/conftest.py)."""

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]
