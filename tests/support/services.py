"""Where the tests' services are: one variable each, honoured by every test.

* ``LATTICE_TEST_REDIS_URL`` -- the Redis every test uses (default
  ``redis://127.0.0.1:6379/0``). Tests keep to their own key prefixes
  (``test-<uuid>``) and delete their keys; they never flush a database, so any
  DB number of a shared server works.
* ``LATTICE_TEST_PG_URL`` -- the PostgreSQL of the tests marked ``postgres``
  (default ``postgresql://postgres@127.0.0.1:5432/test``).

* ``LATTICE_TEST_SCREENSHOTS`` -- where the browser tests save the operations
  page's screenshots (default: the test's temporary directory).

These three are the only ``LATTICE_*`` variables the suite reads from the caller;
``tests/conftest.py`` removes every other one (and ``FLOWER_*``, ``ANTHROPIC_*``,
``DEEPSEEK_*``) from the test process, and tests that start subprocesses set
what those need explicitly.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

TEST_REDIS_ENV = "LATTICE_TEST_REDIS_URL"
"""The variable naming the tests' Redis."""

TEST_PG_ENV = "LATTICE_TEST_PG_URL"
"""The variable naming the tests' PostgreSQL."""

TEST_SCREENSHOTS_ENV = "LATTICE_TEST_SCREENSHOTS"
"""Where the browser tests save their screenshots (tests/e2e/browser.py; default: a temporary directory)."""

TEST_VARIABLES = (TEST_REDIS_ENV, TEST_PG_ENV, TEST_SCREENSHOTS_ENV)
"""The documented test variables, kept in the test process's environment."""

REDIS_URL = os.environ.get(TEST_REDIS_ENV) or "redis://127.0.0.1:6379/0"
"""The tests' Redis URL."""

PG_URL = os.environ.get(TEST_PG_ENV) or "postgresql://postgres@127.0.0.1:5432/test"
"""The tests' PostgreSQL URL."""

_redis = urlsplit(REDIS_URL)
REDIS_HOST: str = _redis.hostname or "127.0.0.1"
"""Host of the tests' Redis (for raw sockets, e.g. a proxy in front of it)."""

REDIS_PORT: int = _redis.port or 6379
"""TCP port of the tests' Redis."""

REDIS_DB: int = int(_redis.path.strip("/") or 0)
"""Database number of the tests' Redis (for URLs through a proxy in front of it)."""


def settings_for(key_prefix: str, **overrides: Any) -> Any:
    """``LatticeSettings`` for a test: the tests' Redis as broker (never the
    library's default ``redis://127.0.0.1:6379/0``), key prefix ``key_prefix``,
    plus keyword ``overrides`` (fields of ``LatticeSettings``; a ``broker_url``
    among them wins, e.g. a proxy's or a private server's URL)."""
    from lattice_client.settings import get_settings  # lazily: conftest imports this module first

    return get_settings(**{"broker_url": REDIS_URL, "key_prefix": key_prefix, **overrides})


def deployment_redis_url() -> str:
    """The Redis of the deployment a worker-side test tool runs in (its runs and
    registry, where the tools keep their records): ``LATTICE_BROKER_URL`` when
    it is Redis, ``LATTICE_MAILBOX_URL`` with a RabbitMQ broker, else the tests' Redis
    (also when the mailboxes are on a Redis Cluster: the tools' records stay on one Redis)."""
    from lattice_client.settings import is_amqp_url, is_cluster_url  # lazily, as settings_for

    broker = os.environ.get("LATTICE_BROKER_URL") or REDIS_URL
    if is_amqp_url(broker):
        mailbox = os.environ.get("LATTICE_MAILBOX_URL") or REDIS_URL
        return REDIS_URL if is_cluster_url(mailbox) else mailbox
    return broker


__all__ = [
    "PG_URL",
    "REDIS_DB",
    "REDIS_HOST",
    "REDIS_PORT",
    "REDIS_URL",
    "TEST_PG_ENV",
    "TEST_REDIS_ENV",
    "TEST_SCREENSHOTS_ENV",
    "TEST_VARIABLES",
    "deployment_redis_url",
    "settings_for",
]
