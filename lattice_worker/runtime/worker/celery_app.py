"""The worker's Celery app: ``app = make_celery_app(process.settings())`` plus the tasks.

Design: docs/architecture.md (JSON only, ``acks_late``, ``reject_on_worker_lost``,
prefetch 1, task events for Flower, key prefix everywhere -- all set by
:func:`lattice_client.celery_config.make_celery_app`) and "Async inside
Celery": each worker process keeps one asyncio event loop, created in
``worker_process_init`` for prefork pool processes (lazily otherwise), and
runs every task's coroutine on it (:mod:`lattice_worker.runtime.worker.loops`).

The worker's app sends its steps without Celery's task-sent event (see
``app.conf.task_send_sent_event`` below); received, started and succeeded
events are sent as configured.

Signals used:

* ``worker_process_init`` (each prefork pool process): drop the loop and the
  contexts inherited from the parent and create this process's own loop.
* ``worker_ready`` (the main worker process): start the registry heartbeat
  (:class:`~lattice_worker.runtime.worker.heartbeat.Heartbeat`: the teams and queues
  this worker serves, with an expiring entry) and, unless ``LATTICE_REAPER=0``,
  the reaper thread (:class:`~lattice_worker.runtime.reaper.sweep.Reaper`); and
  silence Celery's warning, at each lost broker connection, that running tasks
  are not cancelled (lattice_client/celery_config.py chose that).
* ``worker_shutdown``: stop both (the heartbeat deletes the entry). A cold
  shutdown sends none: the entry is deleted at the process's exit (``atexit``).
* ``worker_process_shutdown`` (each pool process) and ``worker_shutdown``:
  flush the tracers of the served teams (:func:`~lattice_worker.runtime.run.trace.flush_tracers`),
  so spans an exporter still buffers are sent before the process exits.

Run it with ``lattice worker TEAM_REF`` (which also loads the team and
chooses the queues), or ``celery -A lattice_worker.runtime.worker.celery_app worker -Q ...``
with ``LATTICE_WORKER_TEAMS`` set.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import warnings
from typing import Any

from celery import signals
from celery.exceptions import CPendingDeprecationWarning

from lattice_client.celery_config import make_celery_app
from lattice_mailbox.urls import mask_url

from ..reaper.sweep import Reaper
from ..run.trace import flush_tracers
from . import aio_pool, loops, process, tasks
from .heartbeat import Heartbeat, pool_name, worker_info

logger = logging.getLogger("lattice_worker.celery")

REAPER_ENV = "LATTICE_REAPER"
"""Set to ``0`` to run a worker without its reaper thread."""

app = make_celery_app(process.settings())
# The steps a worker sends (doorbells, resumes, child runs) carry no task-sent
# event: Flower lists each of them from its task-received event on (name, args,
# worker, state), and the event would cost a PUBLISH and its message per step
# (measured in bench/distributed.py). The client's run_lead keeps its event.
app.conf.task_send_sent_event = False
tasks.register(app)


_pool_producer: Any = None


def _producer() -> Any:
    # On the asyncio pool's loop thread (where every step of the process sends)
    # one kombu producer is kept: acquiring one from Celery's producer pool for
    # every step cost about a sixth of a send (bench/distributed.py (a)). Other
    # threads (a threads pool's 200, the reaper) take one from Celery's pool per
    # send and give it back: the pool holds broker_pool_limit (10) of them.
    # The kept producer's publish re-establishes a lost connection itself (kombu's ensure).
    global _pool_producer
    if not aio_pool.in_pool_loop():
        return None
    if _pool_producer is None:
        _pool_producer = app.producer_pool.acquire(block=True)
    return _pool_producer


def _send_task(name: str, args: list[Any], queue: str, countdown: float | None = None) -> None:
    options: dict[str, Any] = {
        # Flower's args column (Celery's saferepr of them is slower and the args are short strings)
        "argsrepr": repr(args),
        "kwargsrepr": "{}",
    }
    producer = _producer()
    if producer is not None:
        options["producer"] = producer
    origin = tasks.current_origin.get()  # the step that sends it is its parent (Flower)
    if origin is not None:
        options.update(parent_id=origin[0], root_id=origin[1])
    if countdown is not None:  # a step waiting for its model call's turn (shared rate limits)
        options["countdown"] = countdown
    app.send_task(name, args=args, queue=queue, **options)


process.set_task_sender(_send_task)

_reaper: Reaper | None = None
_heartbeat: Heartbeat | None = None


@signals.worker_ready.connect
def _quiet_cancel_warning(**_: Any) -> None:
    # Celery warns at every lost broker connection that it does not cancel running
    # tasks then: our choice (lattice_client/celery_config.py says why), not news.
    # (after Celery's log setup, which makes its pending-deprecation warnings "always")
    warnings.filterwarnings(
        "ignore",
        message=r"\s*In Celery 5\.1 we introduced an optional breaking change",
        category=CPendingDeprecationWarning,
    )


@signals.celeryd_after_setup.connect
def _only_consumed_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # Celery's native delayed delivery (RabbitMQ quorum queues) binds every queue the
    # app knows, the default queue too, which this worker never declares (it consumes
    # only -Q): its exchange is missing, and every worker start logged "Failed to bind
    # queue '<prefix>.default'" and a CRITICAL "Native delayed delivery will not be
    # available". The app of a worker only needs the queues it consumes (the steps it
    # sends name theirs and are created on use: task_create_missing_queues).
    queues = getattr(getattr(instance, "app", None), "amqp", None)
    queues = getattr(queues, "queues", None)
    consumed = getattr(queues, "consume_from", None)
    if not queues or not consumed:
        return
    for name in [name for name in queues if name not in consumed]:
        del queues[name]


@signals.worker_process_init.connect
def _init_pool_process(**_: Any) -> None:
    loops.reset_after_fork()
    gc.freeze()


@signals.worker_ready.connect
def _freeze_startup_objects(**_: Any) -> None:
    # Every object made while the worker started (imported modules, the teams, Celery's
    # app) moves to the collector's permanent generation: a full collection then
    # traverses only what the steps made since (Python's gc.freeze()).
    gc.freeze()


@signals.worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    if _heartbeat is not None:
        return
    settings = process.settings()
    controller = getattr(sender, "controller", None)
    info = worker_info(
        node=str(getattr(sender, "hostname", "") or process.worker_id()),
        teams=process.registry().publication(),
        mailboxes=process.registry().mailbox_ids(),
        queues=list(app.amqp.queues.consume_from or {}),
        pool=pool_name(getattr(controller, "pool", None) or app.conf.worker_pool),
        concurrency=int(getattr(controller, "concurrency", 0) or 0),
        interval_s=settings.registry_heartbeat_seconds,
    )
    _heartbeat = Heartbeat(info, settings.state_url, settings.key_prefix, settings.registry_heartbeat_seconds)
    _heartbeat.start()
    atexit.register(_leave_registry_at_exit, os.getpid())
    logger.info(
        "registry: %s serves %s on %d queue(s) (heartbeat every %.1f s)",
        info.node,
        ", ".join(sorted(info.team_names())) or "no team",
        len(info.queues),
        info.heartbeat_seconds,
    )


def process_local_mailbox(url: str) -> bool:
    """Whether mailbox ``url`` keeps its messages inside one process:
    ``memory://``, or SQLite in memory (``sqlite://``, ``sqlite:///``,
    ``sqlite:///:memory:``, ``mode=memory``)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme == "memory":
        return True
    if scheme.split("+")[0] != "sqlite":
        return False
    path, _, query = rest.partition("?")
    return path.removeprefix("/") in ("", ":memory:") or "mode=memory" in query


@signals.worker_ready.connect
def _warn_process_local_mailbox(**_: Any) -> None:
    url = process.settings().mailbox_url
    if process_local_mailbox(url):
        logger.warning(
            "the mailbox URL %s (LATTICE_MAILBOX_URL) keeps the mailboxes inside this worker process: "
            "no other worker or pool process, no client and no lattice command sees its messages; "
            "give redis://..., postgresql://... or a sqlite:///path file",
            mask_url(url),
        )


def _leave_registry_at_exit(pid: int) -> None:
    # A cold shutdown (SIGQUIT, a second Ctrl-C: Celery's WorkController.terminate)
    # sends no worker_shutdown, so the entry stayed live for three heartbeats and
    # submits were accepted for a worker that was gone. Not in a forked child.
    global _heartbeat
    if os.getpid() == pid and _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


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
    global _reaper, _heartbeat
    if _reaper is not None:
        _reaper.stop()
        _reaper = None
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _flush_tracers(**_: Any) -> None:
    try:
        loops.run(flush_tracers(process.registry().teams()))
    except Exception:  # shutting down: never in the way
        logger.warning("could not flush the tracers", exc_info=True)


__all__ = ["app"]
