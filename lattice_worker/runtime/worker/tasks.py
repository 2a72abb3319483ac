"""The Celery tasks: ``lattice.run_lead``, ``lattice.deliver``, ``lattice.resume_lead``.

Each task is a thin synchronous wrapper that runs its async body through
:func:`lattice_worker.runtime.worker.loops.run` (on the asyncio pool's loop, or the
task thread's own) with that loop's :class:`~lattice_worker.runtime.run.context.WorkerContext`:

* ``lattice.run_lead(run_id)`` -> :func:`lattice_worker.runtime.lead.segment.run_lead`
  (only from ``queued``; a duplicate is a no-op);
* ``lattice.deliver(mailbox_id[, message_id])`` -> :func:`lattice_worker.runtime.member.step.deliver`
  (the doorbell; nothing to claim is a no-op);
* ``lattice.resume_lead(run_id)`` -> :func:`lattice_worker.runtime.lead.segment.resume_lead`
  (once per suspension).

No task waits for another: each ends after its own step and enqueues the
next steps (doorbells, the resume, child runs) as Celery tasks of their own,
even on a queue this worker consumes: every step shows in Flower with its
state, and any worker on the step's queue may take it.
A Redis connection failure is retried by Celery (every body is idempotent up
to its first state change). A body that raises ``SystemExit`` or another
``BaseException`` that is not an ``Exception`` fails its task with
:class:`StepInterruptedError` (acknowledged; the work is recovered by lease).
Each task returns a short word saying what happened (``"idle"``,
``"skipped"``, ``"suspended"``, ``"done"``...), visible in Flower and the
worker log.

:func:`register` adds the tasks to a Celery app (``celery_app`` does, for its ``app``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any

from billiard.common import terminate_handler_fired
from celery import current_task
from celery.exceptions import WorkerShutdown, WorkerTerminate
from celery.worker.request import Request
from greenlet import GreenletExit
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import check_run_id

from ...tools.tool_definition import sync_handler_executor, sync_handlers_in_threads
from ..lead import segment as lead_segment
from ..member import step as member_step
from ..run.context import WorkerContext
from . import aio_pool, loops, process

logger = logging.getLogger("lattice_worker.runtime.worker.tasks")

_BODIES: dict[str, Callable[..., Awaitable[str]]] = {
    RUN_LEAD_TASK: lead_segment.run_lead,
    DELIVER_TASK: member_step.deliver,
    RESUME_LEAD_TASK: lead_segment.resume_lead,
}


current_origin: ContextVar[tuple[str, str] | None] = ContextVar("lattice_step_origin", default=None)
"""``(task id, root id)`` of the Celery task running this step: the steps it
enqueues name it as their parent (Flower shows the chain), on every pool."""


async def run_step(
    ctx: WorkerContext, task: str, arg: str, *more: str, origin: tuple[str, str] | None = None
) -> str:
    """Run the body of ``task`` on ``arg`` (and ``more`` arguments: a doorbell's
    message id); its queued writes are written before the task ends (the steps
    it enqueued may already be running elsewhere and find them). ``origin``:
    the Celery task's ``(id, root_id)`` (:data:`current_origin`). Synchronous
    tool handlers run in threads (:data:`~lattice_worker.tools.tool_definition.sync_handlers_in_threads`;
    on the asyncio pool, its own tool threads: :func:`~lattice_worker.runtime.worker.aio_pool.tool_executor`).
    Returns the body's outcome word."""
    threads = sync_handlers_in_threads.set(True)
    executor = sync_handler_executor.set(aio_pool.tool_executor())
    origin_token = current_origin.set(origin)
    try:
        return await _BODIES[task](ctx, arg, *more)
    finally:
        try:
            await ctx.writer.flush()
        finally:
            current_origin.reset(origin_token)
            sync_handler_executor.reset(executor)
            sync_handlers_in_threads.reset(threads)


def _origin() -> tuple[str, str] | None:
    request = getattr(current_task, "request", None)
    task_id = getattr(request, "id", None)
    if not task_id:
        return None
    return task_id, getattr(request, "root_id", None) or task_id


class StepRequest(Request):
    """Celery's worker ``Request`` for the step tasks, whose ``task-started``
    event also carries the ``routing_key`` (and ``exchange``) the message came
    by: the member's queue (``<prefix>.<team>.<member>``). Flower shows it (its
    task state takes the fields of every event); the worker sends no task-sent
    event for its steps, the one that would carry it otherwise, and the fields
    ride on an event the worker sends anyway (no extra publish)."""

    def send_event(self, type: str, **fields: Any) -> None:  # noqa: A002 (Celery's name)
        if type == "task-started":
            info = self.delivery_info or {}
            fields.setdefault("routing_key", info.get("routing_key"))
            fields.setdefault("exchange", info.get("exchange"))
        super().send_event(type, **fields)


_RETRY = {
    # registered on this app only: Celery would otherwise add "shared" tasks to every app
    # created in the process (the client's apps only send tasks by name)
    "shared": False,
    "autoretry_for": (RedisConnectionError, RedisTimeoutError),
    "retry_backoff": True,
    "retry_backoff_max": 10,
    "max_retries": 5,
    "Request": StepRequest,
}


class StepInterruptedError(RuntimeError):
    """A step's body raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit`` from a library calling ``sys.exit()``, ``KeyboardInterrupt``,
    a ``CancelledError`` escaping it): the task fails with this error instead,
    so Celery records the failure and acknowledges the message (Celery's
    thread-based pools leave such a message unacknowledged, holding a slot of
    the worker until it restarts). The step's claim or lease is left to expire:
    the reaper recovers the work as after a crash (docs/architecture.md)."""


def _run(task: str, body: Coroutine[Any, Any, str]) -> str:
    # loops.run(body), with a non-Exception BaseException turned into StepInterruptedError;
    # Celery's own shutdown signals, a pool process's termination and a greenlet's exit pass through
    try:
        return loops.run(body)
    except (WorkerShutdown, WorkerTerminate, GreenletExit):
        raise
    except Exception:
        raise
    except BaseException as exc:
        if terminate_handler_fired():
            # a prefork pool process got its termination signal (billiard's handler raises
            # SystemExit): the process is on its way out, and Celery requeues the message
            raise
        logger.error("%s: the step raised %r; the task fails and its work is recovered by lease", task, exc)
        raise StepInterruptedError(f"{task}: the step raised {exc!r}") from exc


def _bad_arg(task: str, name: str, value: object) -> str:
    what = "a run id (1-128 characters of [A-Za-z0-9_.:-])" if name == "run_id" else "a non-empty string"
    logger.error("%s: %s must be %s, got %r; ignored", task, name, what, value)
    return "invalid"


def _bad_run_id(run_id: object) -> bool:
    try:
        check_run_id(run_id)  # type: ignore[arg-type]
    except ValueError:
        return True
    return False


def run_lead(run_id: str) -> str:
    """Start the lead of run ``run_id`` (see :func:`lattice_worker.runtime.lead.segment.run_lead`)."""
    if _bad_run_id(run_id):
        return _bad_arg(RUN_LEAD_TASK, "run_id", run_id)
    return _run(RUN_LEAD_TASK, run_step(process.context(), RUN_LEAD_TASK, run_id, origin=_origin()))


def deliver(mailbox_id: str, message_id: str | None = None) -> str:
    """The doorbell of ``mailbox_id``, for ``message_id`` when given (see
    :func:`lattice_worker.runtime.member.step.deliver`)."""
    if not isinstance(mailbox_id, str) or not mailbox_id:
        return _bad_arg(DELIVER_TASK, "mailbox_id", mailbox_id)
    if message_id is not None and (not isinstance(message_id, str) or not message_id):
        return _bad_arg(DELIVER_TASK, "message_id", message_id)
    more = (message_id,) if message_id else ()
    return _run(DELIVER_TASK, run_step(process.context(), DELIVER_TASK, mailbox_id, *more, origin=_origin()))


def resume_lead(run_id: str) -> str:
    """Resume run ``run_id`` (see :func:`lattice_worker.runtime.lead.segment.resume_lead`)."""
    if _bad_run_id(run_id):
        return _bad_arg(RESUME_LEAD_TASK, "run_id", run_id)
    return _run(RESUME_LEAD_TASK, run_step(process.context(), RESUME_LEAD_TASK, run_id, origin=_origin()))


def register(app: Any) -> dict[str, Any]:
    """Register the three tasks on the Celery ``app`` (with Celery's retry of
    Redis connection errors); returns ``{task name: task}``."""
    return {
        name: app.task(name=name, **_RETRY)(fn)
        for name, fn in ((RUN_LEAD_TASK, run_lead), (DELIVER_TASK, deliver), (RESUME_LEAD_TASK, resume_lead))
    }


__all__ = [
    "StepInterruptedError",
    "StepRequest",
    "current_origin",
    "deliver",
    "register",
    "resume_lead",
    "run_lead",
    "run_step",
]
