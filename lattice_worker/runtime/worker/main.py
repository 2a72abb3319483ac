"""``lattice worker TEAM_REF``: start a Celery worker for a team's queues.

docs/architecture.md. :func:`run_worker` loads the team (and its nested
teams) through the registry -- so a bad reference or a lead that is not an
``AgentSpec`` fails here with a clear error, before Celery starts --, picks the
queues and hands over to ``app.worker_main``; once Celery is ready, the
worker's heartbeat publishes its teams and queues in the live registry
(:mod:`lattice_worker.runtime.worker.heartbeat`):

* no ``members``: the lead queue and every member queue of the team and of its
  nested teams (a single worker with ``--concurrency 1`` runs whole runs);
* ``members``: only those queues (``"lead"`` names the lead queues).

Pool: the ``asyncio`` pool by default (:data:`DEFAULT_POOL`,
:class:`~lattice_worker.runtime.worker.aio_pool.AsyncioPool`), with
:data:`DEFAULT_ASYNCIO_CONCURRENCY` steps in flight unless ``--concurrency``
says otherwise -- a model call mostly waits on the network, so one process
keeps many in flight, every step on the pool's one event loop.
``--pool threads`` (:data:`DEFAULT_THREADS` threads, each on its own event
loop: :mod:`lattice_worker.runtime.worker.loops`) is the alternative for tools that
block; ``--pool prefork`` (Celery's default pool; ``--concurrency`` processes, one
task each, Celery's default of one per CPU) suits CPU-bound tools. Any other
Celery worker option (``extra_args``) passes through. Every worker gets a
unique node name (``lattice.<team>.<random>@<host>``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

from ...errors import ConfigError
from .registry import TEAMS_ENV

DEFAULT_POOL = "asyncio"
"""The pool ``lattice worker`` uses unless ``--pool``/``-P`` is given: every step
in a greenlet on one event loop (:class:`~lattice_worker.runtime.worker.aio_pool.AsyncioPool`)."""

DEFAULT_THREADS = 200
"""Default ``--concurrency`` of the ``threads`` pool: task threads, i.e. steps
(model calls) in flight in one process (see docs/deploy.md, "Pools and sizing for model latency")."""

DEFAULT_ASYNCIO_CONCURRENCY = 300
"""Default ``--concurrency`` of the ``asyncio`` pool: steps (model calls) in
flight in one process (see docs/deploy.md, "Pools and sizing for model latency"):
measured by ``bench/distributed.py`` (b), one process keeps 0.91 of the ideal
throughput with 300 calls of 2 s in flight (150 steps/s, about 4.6 ms of CPU
each) and 0.87 with 400; at 5 s per call, 0.91 with 600."""

_DEFAULT_SIZES = {"asyncio": DEFAULT_ASYNCIO_CONCURRENCY, "threads": DEFAULT_THREADS}

POOLS = ("asyncio", "threads", "prefork", "solo")
"""The pools a lattice worker runs on (``--pool``; asyncio is the default)."""


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


def _without_pool(extra_args: Sequence[str]) -> list[str]:
    args = list(extra_args)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--pool", "-P"):
            skip = True
            continue
        if arg.startswith("--pool=") or (arg.startswith("-P") and len(arg) > 2):
            continue
        out.append(arg)
    return out


def worker_argv(
    queues: Sequence[str], node: str, concurrency: int | None, extra_args: Sequence[str]
) -> list[str]:
    """The argv given to ``app.worker_main``: ``worker -Q <queues> -n <node> -E
    [--concurrency N] [--loglevel INFO unless given] <extra_args>``.

    The ``asyncio`` pool (the default, or ``--pool asyncio``) is not named in the
    argv: Celery knows it from ``app.conf.worker_pool`` (:func:`pool_setting`).
    Without ``concurrency`` the ``asyncio`` pool gets :data:`DEFAULT_ASYNCIO_CONCURRENCY`
    and the ``threads`` pool :data:`DEFAULT_THREADS`; other pools keep Celery's default."""
    argv = ["worker", "-Q", ",".join(queues), "-n", node, "-E"]
    pool = given_pool(extra_args) or DEFAULT_POOL
    if pool == "asyncio":
        extra_args = _without_pool(extra_args)
    if concurrency is None:
        concurrency = _DEFAULT_SIZES.get(pool)
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if not any(a in ("-l", "--loglevel") or a.startswith("--loglevel=") for a in extra_args):
        argv += ["--loglevel", "INFO"]
    return argv + list(extra_args)


def pool_setting(extra_args: Sequence[str]) -> str | None:
    """The ``worker_pool`` setting for a worker started with ``extra_args``: the
    :class:`~lattice_worker.runtime.worker.aio_pool.AsyncioPool` path for the ``asyncio``
    pool (the default), else ``None`` (the pool named in the argv)."""
    if (given_pool(extra_args) or DEFAULT_POOL) == "asyncio":
        from .aio_pool import POOL_PATH

        return POOL_PATH
    return None


def run_worker(
    team_ref: str, members: Sequence[str] | None, concurrency: int | None, extra_args: Sequence[str] | None
) -> None:
    """Start a Celery worker serving ``team_ref`` (blocks until the worker stops).

    Args:
        team_ref: ``"package.module:attribute"`` or a registered team name.
        members: member names whose queues to consume (``"lead"`` = the lead's); empty = all.
        concurrency: Celery ``--concurrency`` (steps in flight on the default
            ``asyncio`` pool, threads of ``--pool threads``, processes of
            ``--pool prefork``), or ``None``: :data:`DEFAULT_ASYNCIO_CONCURRENCY`
            on the ``asyncio`` pool, :data:`DEFAULT_THREADS` on ``threads``,
            Celery's default on another pool.
        extra_args: more Celery worker options, passed through unchanged.

    Raises :class:`ConfigError` for a bad reference, a lead that is not an
    ``AgentSpec``, an unknown member, a pool not in :data:`POOLS`, or a
    concurrency below 1 (or given to the one-task ``solo`` pool).
    """
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {concurrency}")
    pool = given_pool(list(extra_args or []))
    if pool is not None and pool not in POOLS:
        raise ConfigError(f"--pool {pool}: not a pool lattice workers run on; use one of {', '.join(POOLS)}")
    if concurrency is not None and pool == "solo":
        raise ConfigError(
            "--concurrency does nothing with --pool solo (one task at a time): leave one of them out"
        )
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
    pool = pool_setting(list(extra_args or []))
    if pool is not None:
        app.conf.worker_pool = pool
    app.worker_main(worker_argv(queues, node, concurrency, list(extra_args or [])))


__all__ = [
    "DEFAULT_ASYNCIO_CONCURRENCY",
    "DEFAULT_POOL",
    "DEFAULT_THREADS",
    "POOLS",
    "given_pool",
    "pool_setting",
    "run_worker",
    "worker_argv",
]
