"""``lattice worker TEAM_REF``: start a Celery worker for a team's queues.

docs/architecture.md. :func:`run_worker` loads the team (and its nested
teams) through the registry -- so a bad reference or a lead that is not an
``AgentSpec`` fails here with a clear error, before Celery starts --, picks the
queues and hands over to ``app.worker_main``; once Celery is ready, the
worker's heartbeat publishes its teams and queues in the live registry
(:mod:`lattice_worker.runtime.heartbeat`):

* no ``members``: the lead queue and every member queue of the team and of its
  nested teams (a single worker with ``--concurrency 1`` runs whole runs);
* ``members``: only those queues (``"lead"`` names the lead queues).

Pool: Celery's ``threads`` pool by default (:data:`DEFAULT_POOL`), with
:data:`DEFAULT_THREADS` threads unless ``--concurrency`` says otherwise -- a
model call mostly waits on the network, so one process keeps many in flight,
each task thread on its own event loop (:mod:`lattice_worker.runtime.loops`).
``--pool prefork`` (Celery's default pool; ``--concurrency`` processes, one
task each, Celery's default of one per CPU) suits CPU-bound tools. Any other
Celery worker option (``extra_args``) passes through. Every worker gets a
unique node name (``lattice.<team>.<random>@<host>``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

from ..errors import ConfigError
from .registry import TEAMS_ENV

DEFAULT_POOL = "threads"
"""The Celery pool ``lattice worker`` uses unless ``--pool``/``-P`` is given."""

DEFAULT_THREADS = 200
"""Default ``--concurrency`` of the ``threads`` pool: task threads, i.e. steps
(model calls) in flight in one process (see the README's "Sizing workers")."""


def given_pool(extra_args: Sequence[str]) -> str | None:
    """The pool named by ``--pool X`` / ``--pool=X`` / ``-P X`` / ``-PX`` in
    ``extra_args``, or ``None``."""
    args = list(extra_args)
    for i, arg in enumerate(args):
        if arg in ("--pool", "-P"):
            return args[i + 1] if i + 1 < len(args) else None
        if arg.startswith("--pool="):
            return arg.split("=", 1)[1]
        if arg.startswith("-P") and len(arg) > 2:
            return arg[2:].lstrip("=")
    return None


def worker_argv(
    queues: Sequence[str], node: str, concurrency: int | None, extra_args: Sequence[str]
) -> list[str]:
    """The argv given to ``app.worker_main``: ``worker -Q <queues> -n <node> -E
    [--pool threads unless a pool is given] [--concurrency N] [--loglevel INFO
    unless given] <extra_args>``. Without ``concurrency`` the ``threads`` pool
    gets :data:`DEFAULT_THREADS`; other pools keep Celery's default."""
    argv = ["worker", "-Q", ",".join(queues), "-n", node, "-E"]
    pool = given_pool(extra_args)
    if pool is None:
        pool = DEFAULT_POOL
        argv += ["--pool", pool]
    if concurrency is None and pool == "threads":
        concurrency = DEFAULT_THREADS
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
        concurrency: Celery ``--concurrency`` (threads of the default ``threads``
            pool, processes of ``--pool prefork``), or ``None``: :data:`DEFAULT_THREADS`
            threads, or Celery's default for another pool.
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
    from .celery_app import app

    node = f"lattice.{root.name}.{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    app.worker_main(worker_argv(queues, node, concurrency, list(extra_args or [])))


__all__ = ["DEFAULT_POOL", "DEFAULT_THREADS", "given_pool", "run_worker", "worker_argv"]
