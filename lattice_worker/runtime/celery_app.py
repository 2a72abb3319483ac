"""The worker's Celery app: ``app = make_celery_app(process.settings())`` plus the tasks.

Design: docs/architecture.md (JSON only, ``acks_late``, ``reject_on_worker_lost``,
prefetch 1, task events for Flower, key prefix everywhere -- all set by
:func:`lattice_client.celery_config.make_celery_app`) and "Async inside
Celery": each worker process keeps one asyncio event loop, created in
``worker_process_init`` for prefork pool processes (lazily otherwise), and
runs every task's coroutine on it (:mod:`lattice_worker.runtime.loops`).

Signals used:

* ``worker_process_init`` (each prefork pool process): drop the loop and the
  contexts inherited from the parent and create this process's own loop.
* ``worker_ready`` (the main worker process): start the reaper thread
  (:class:`~lattice_worker.runtime.reaper.Reaper`), unless ``LATTICE_REAPER=0``.
* ``worker_shutdown``: stop it.

Run it with ``lattice worker TEAM_REF`` (which also loads the team and
chooses the queues), or ``celery -A lattice_worker.runtime.celery_app worker -Q ...``
with ``LATTICE_WORKER_TEAMS`` set.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals

from lattice_client.celery_config import make_celery_app

from . import loops, process, tasks
from .reaper import Reaper

logger = logging.getLogger("lattice_worker.celery")

REAPER_ENV = "LATTICE_REAPER"
"""Set to ``0`` to run a worker without its reaper thread."""

app = make_celery_app(process.settings())
tasks.register(app)


def _send_task(name: str, args: list[Any], queue: str) -> None:
    app.send_task(name, args=args, queue=queue)


process.set_task_sender(_send_task)

_reaper: Reaper | None = None


@signals.worker_process_init.connect
def _init_pool_process(**_: Any) -> None:
    loops.reset_after_fork()


@signals.worker_ready.connect
def _start_reaper(**_: Any) -> None:
    global _reaper
    if os.environ.get(REAPER_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.info("reaper disabled (%s=0)", REAPER_ENV)
        return
    if _reaper is None:
        settings = process.settings()
        _reaper = Reaper(process.new_context, interval_s=settings.reaper_interval_seconds)
        _reaper.start()
        logger.info("reaper started (every %.1f s)", settings.reaper_interval_seconds)


@signals.worker_shutdown.connect
def _stop_reaper(**_: Any) -> None:
    global _reaper
    if _reaper is not None:
        _reaper.stop()
        _reaper = None


__all__ = ["app"]
