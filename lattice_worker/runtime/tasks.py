"""The Celery tasks: ``lattice.run_lead``, ``lattice.deliver``, ``lattice.resume_lead``.

DESIGN.md section 5 steps 1-6; issue 6 item 3. Each task is a thin
synchronous wrapper that runs its async body on the worker process's event
loop (:func:`lattice_worker.runtime.loops.run`) with this thread's
:class:`~lattice_worker.runtime.worker_context.WorkerContext`:

* ``lattice.run_lead(run_id)`` -> :func:`lattice_worker.runtime.lead_run.run_lead`
  (only from ``queued``; a duplicate is a no-op);
* ``lattice.deliver(mailbox_id)`` -> :func:`lattice_worker.runtime.member_run.deliver`
  (the doorbell; nothing to claim is a no-op);
* ``lattice.resume_lead(run_id)`` -> :func:`lattice_worker.runtime.lead_run.resume_lead`
  (once per suspension).

No task waits for another: each ends after its own step and enqueues the
next steps (doorbells, the resume, child runs) as Celery tasks of their own,
even on a queue this worker consumes: every step shows in Flower with its
state, and any worker on the step's queue may take it.
A Redis connection failure is retried by Celery (every body is idempotent up
to its first state change). Each task returns a short word saying what
happened (``"idle"``, ``"skipped"``, ``"suspended"``, ``"done"``...), visible
in Flower and the worker log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK

from . import lead_run, loops, member_run, process
from .celery_app import app
from .worker_context import WorkerContext

logger = logging.getLogger("lattice_worker.runtime.tasks")

_BODIES: dict[str, Callable[[WorkerContext, str], Awaitable[str]]] = {
    RUN_LEAD_TASK: lead_run.run_lead,
    DELIVER_TASK: member_run.deliver,
    RESUME_LEAD_TASK: lead_run.resume_lead,
}


async def run_step(ctx: WorkerContext, task: str, arg: str) -> str:
    """Run the body of ``task`` on ``arg``; its queued writes are written before
    the task ends (the steps it enqueued may already be running elsewhere and
    find them). Returns the body's outcome word."""
    try:
        return await _BODIES[task](ctx, arg)
    finally:
        await ctx.flush_events()


_RETRY = {
    # registered on this app only: Celery would otherwise add "shared" tasks to every app
    # created in the process (the client's apps only send tasks by name)
    "shared": False,
    "autoretry_for": (RedisConnectionError, RedisTimeoutError),
    "retry_backoff": True,
    "retry_backoff_max": 10,
    "max_retries": 5,
}


def _bad_arg(task: str, name: str, value: object) -> str:
    logger.error("%s: %s must be a non-empty string, got %r; ignored", task, name, value)
    return "invalid"


@app.task(name=RUN_LEAD_TASK, **_RETRY)
def run_lead(run_id: str) -> str:
    """Start the lead of run ``run_id`` (see :func:`lattice_worker.runtime.lead_run.run_lead`)."""
    if not isinstance(run_id, str) or not run_id:
        return _bad_arg(RUN_LEAD_TASK, "run_id", run_id)
    return loops.run(run_step(process.context(), RUN_LEAD_TASK, run_id))


@app.task(name=DELIVER_TASK, **_RETRY)
def deliver(mailbox_id: str) -> str:
    """The doorbell of ``mailbox_id`` (see :func:`lattice_worker.runtime.member_run.deliver`)."""
    if not isinstance(mailbox_id, str) or not mailbox_id:
        return _bad_arg(DELIVER_TASK, "mailbox_id", mailbox_id)
    return loops.run(run_step(process.context(), DELIVER_TASK, mailbox_id))


@app.task(name=RESUME_LEAD_TASK, **_RETRY)
def resume_lead(run_id: str) -> str:
    """Resume run ``run_id`` (see :func:`lattice_worker.runtime.lead_run.resume_lead`)."""
    if not isinstance(run_id, str) or not run_id:
        return _bad_arg(RESUME_LEAD_TASK, "run_id", run_id)
    return loops.run(run_step(process.context(), RESUME_LEAD_TASK, run_id))


__all__ = ["deliver", "resume_lead", "run_lead", "run_step"]
