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
next. When the next step is on a queue this worker consumes, the task also
does it at once (:func:`run_step`; at most :data:`MAX_INLINE_STEPS` per task),
which saves a broker round trip per step; the enqueued copy then finds
nothing to do (an idle doorbell, a skipped resume).
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

MAX_INLINE_STEPS = 16
"""Follow-up steps one task may do inline before leaving the rest to their queued copies."""

_BODIES: dict[str, Callable[[WorkerContext, str], Awaitable[str]]] = {
    RUN_LEAD_TASK: lead_run.run_lead,
    DELIVER_TASK: member_run.deliver,
    RESUME_LEAD_TASK: lead_run.resume_lead,
}


async def run_step(ctx: WorkerContext, task: str, arg: str, *, max_inline: int = MAX_INLINE_STEPS) -> str:
    """Run the body of ``task`` on ``arg``, then the follow-ups it recorded in
    ``ctx.follow_ups`` (steps on queues this worker consumes), oldest first, up
    to ``max_inline`` of them; follow-ups not done (budget spent, or an error)
    are enqueued. Returns the first body's outcome word."""
    ctx.follow_ups.clear()
    try:
        outcome = await _BODIES[task](ctx, arg)
        done = 0
        while ctx.follow_ups and done < max_inline:
            name, value, _, _ = ctx.follow_ups.pop(0)
            inline = await _BODIES[name](ctx, value)
            done += 1
            logger.info("inline %s(%s) -> %s", name, value, inline)
    finally:
        try:
            await ctx.flush_events()  # the bodies leave their writes to the next inline step
        finally:
            # whatever was not done here goes to the queues -- after this task's
            # writes are stored, so the steps it enqueues find them
            ctx.publish_follow_ups()
    return outcome


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


__all__ = ["MAX_INLINE_STEPS", "deliver", "resume_lead", "run_lead", "run_step"]
