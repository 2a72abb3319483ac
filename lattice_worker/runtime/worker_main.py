"""``lattice worker TEAM_REF``: start a Celery worker for a team's queues.

docs/architecture.md. :func:`run_worker` loads the team (and its nested
teams) through the registry -- so a bad reference or a lead that is not an
``AgentSpec`` fails here with a clear error, before Celery starts --, publishes
``{ref, name}`` in ``<prefix>:teams`` for the client, picks the queues and
hands over to ``app.worker_main``:

* no ``members``: the lead queue and every member queue of the team and of its
  nested teams (a single worker with ``--concurrency 1`` runs whole runs);
* ``members``: only those queues (``"lead"`` names the lead queues).

``--concurrency`` and any other Celery worker option (``extra_args``) pass
through. Every worker gets a unique node name (``lattice.<team>.<random>@<host>``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

import redis

from ..errors import ConfigError
from .registry import TEAMS_ENV, teams_key


def worker_argv(
    queues: Sequence[str], node: str, concurrency: int | None, extra_args: Sequence[str]
) -> list[str]:
    """The argv given to ``app.worker_main``: ``worker -Q <queues> -n <node> -E
    [--concurrency N] [--loglevel INFO unless given] <extra_args>``."""
    argv = ["worker", "-Q", ",".join(queues), "-n", node, "-E"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if not any(a in ("-l", "--loglevel") or a.startswith("--loglevel=") for a in extra_args):
        argv += ["--loglevel", "INFO"]
    return argv + list(extra_args)


def run_worker(
    team_ref: str, members: Sequence[str] | None, concurrency: int | None, extra_args: Sequence[str] | None
) -> None:
    """Start a Celery worker serving ``team_ref`` (blocks until the worker stops).

    Args:
        team_ref: ``"package.module:attribute"`` or a registered team name.
        members: member names whose queues to consume (``"lead"`` = the lead's); empty = all.
        concurrency: Celery ``--concurrency`` (pool processes), or ``None`` for Celery's default.
        extra_args: more Celery worker options, passed through unchanged.

    Raises :class:`ConfigError` for a bad reference, a lead that is not an
    ``AgentSpec``, an unknown member, or a concurrency below 1.
    """
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {concurrency}")
    refs = [r for r in os.environ.get(TEAMS_ENV, "").split(",") if r.strip()]
    if team_ref not in refs:
        refs.append(team_ref)
    os.environ[TEAMS_ENV] = ",".join(refs)

    from . import process

    settings = process.settings()
    registry = process.registry()
    root = registry.load(team_ref)
    queues = registry.queues(settings.key_prefix, list(members) if members else None)
    client = redis.Redis.from_url(settings.broker_url)
    try:
        client.hset(teams_key(settings.key_prefix), mapping=registry.publication())
    finally:
        client.close()

    from .celery_app import app

    node = f"lattice.{root.name}.{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    app.worker_main(worker_argv(queues, node, concurrency, list(extra_args or [])))


__all__ = ["run_worker", "worker_argv"]
