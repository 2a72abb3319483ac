"""``AsyncioPool``: a Celery worker pool that runs every task on one asyncio event loop.

A step of the runtime spends nearly all its time waiting (on the model, on
Redis), so one process should hold hundreds of steps in flight. Celery's
``threads`` pool gives each step a thread that blocks on its own event loop;
this pool gives each step a *greenlet* on one event loop instead
(docs/deploy.md, "Pools and sizing for model latency", has the measurements):

* the worker's consumer hands a task to :meth:`AsyncioPool.on_apply` (Celery's
  public pool interface, as its ``threads`` and ``solo`` pools implement it);
* the pool runs Celery's own task tracer -- ``accept_callback``, the task,
  then ``callback`` or ``error_callback``, exactly as the ``threads`` pool does
  with :func:`celery.concurrency.base.apply_target` -- inside a fresh greenlet
  on the pool's event loop thread;
* when the task body wants to wait for a coroutine it calls
  :func:`await_coroutine`, which switches from the task's greenlet back to the
  event loop; the loop awaits the coroutine (running every other step
  meanwhile) and switches back with its result or exception.

So Celery's tracing, acks, events, retries and request context are Celery's
own, unchanged (Celery keys its request context by greenlet when greenlet is
installed, as for its gevent and eventlet pools), and the task body's
coroutine runs as an ordinary asyncio task. The same bridge is what
SQLAlchemy's asyncio extension uses to run synchronous code over asyncio.

Concurrency (``--concurrency N``) is how many tasks the consumer lets in at
once (Celery's prefetch is ``N * worker_prefetch_multiplier``); the pool
itself does not queue.

Costs: everything on the loop shares one thread, so synchronous work in a
step (a blocking tool handler, a hook, CPU-heavy parsing) stalls every other
step of the process while it runs. On workers the runtime runs synchronous
tool handlers in a thread
(:data:`lattice_worker.tools.tool_definition.sync_handlers_in_threads`), of
the pool's own tool thread pool (:func:`tool_executor`: enough threads for
every concurrent call of every step in flight, made as needed, apart from the
loop's default executor); for
CPU-bound tools use ``--pool prefork``. Celery's time limits are not
supported (as with the ``threads`` pool). A ``SystemExit`` or
``KeyboardInterrupt`` raised in a step's asyncio task (asyncio lets them out
of the loop) is logged and the loop goes on; the runtime's tasks turn one
into a failure of the task (``StepInterruptedError`` in
:mod:`lattice_worker.runtime.worker.tasks`), since Celery's ``apply_target`` cannot
complete a request a ``BaseException`` ended.

Select it with ``lattice worker`` (the default) or
``celery worker --pool custom`` with ``CELERY_CUSTOM_WORKER_POOL`` set to
``lattice_worker.runtime.worker.aio_pool:AsyncioPool``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

import greenlet
from celery.concurrency.base import BasePool, apply_target
from celery.concurrency.thread import ApplyResult  # (a future's result, as the threads pool returns)
from celery.worker import state as worker_state

from ...agent.tool_schedule import MAX_CONCURRENT_CALLS

logger = logging.getLogger("lattice_worker.runtime.worker.aio_pool")

T = TypeVar("T")

POOL_PATH = "lattice_worker.runtime.worker.aio_pool:AsyncioPool"
"""The pool's ``module:Class`` path (``worker_pool`` / ``CELERY_CUSTOM_WORKER_POOL``)."""

_pool_loop: asyncio.AbstractEventLoop | None = None


class _TaskGreenlet(greenlet.greenlet):
    """The greenlet one task runs in (its parent is the event loop's greenlet)."""


def in_task_greenlet() -> bool:
    """Whether the caller runs inside a task greenlet of an :class:`AsyncioPool`
    (then :func:`await_coroutine` may be called)."""
    return isinstance(greenlet.getcurrent(), _TaskGreenlet)


_tool_executors: dict[asyncio.AbstractEventLoop, ThreadPoolExecutor] = {}


def tool_executor() -> ThreadPoolExecutor | None:
    """The thread pool of the running loop's :class:`AsyncioPool` for the steps'
    plain-function tool handlers (``None`` off a pool loop: they use the loop's
    default executor). See :data:`~lattice_worker.tools.tool_definition.sync_handler_executor`."""
    try:
        return _tool_executors.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def in_pool_loop() -> bool:
    """Whether the running event loop is an :class:`AsyncioPool`'s (every step of
    the process shares it: blocking work belongs in a thread)."""
    try:
        return asyncio.get_running_loop() is _pool_loop and _pool_loop is not None
    except RuntimeError:
        return False


def await_coroutine(awaitable: Awaitable[T]) -> T:
    """From a task greenlet: wait for ``awaitable`` on the pool's event loop and
    return its result (or raise its exception). Other tasks run meanwhile.

    Raises ``RuntimeError`` outside a task greenlet (:func:`in_task_greenlet`)."""
    current = greenlet.getcurrent()
    if not isinstance(current, _TaskGreenlet):
        raise RuntimeError("await_coroutine() called outside an AsyncioPool task")
    # the coroutine runs in a copy of the task's context (what Celery's task_prerun
    # receivers set there reaches it, as on a thread's own loop)
    return current.parent.switch((awaitable, contextvars.copy_context()))  # type: ignore[no-any-return]


async def run_in_greenlet(fn: Callable[..., T], *args: Any) -> T:
    """Run the synchronous ``fn(*args)`` in a new task greenlet on the running
    loop; each awaitable it passes to :func:`await_coroutine` is awaited here.
    Returns what ``fn`` returns; raises what it raises."""
    task = _TaskGreenlet(fn, greenlet.getcurrent())
    result: Any = task.switch(*args)
    while not task.dead:
        awaitable, context = result
        try:
            if asyncio.iscoroutine(awaitable):
                value = await asyncio.get_running_loop().create_task(awaitable, context=context)
            else:
                value = await awaitable
        except BaseException as exc:  # handed to the task, which may catch it
            result = task.throw(exc)
        else:
            result = task.switch(value)
    return result  # type: ignore[no-any-return]


class StepResult(ApplyResult):
    """What :meth:`AsyncioPool.on_apply` returns for one task (Celery's request
    keeps a weak reference to it and calls :meth:`terminate` on a cold shutdown
    and on ``revoke(terminate=True)``)."""

    def terminate(self, signal: int | None = None) -> None:
        """Nothing: a step of this pool has no process of its own to kill, and
        cancelling it would let it write the end of an interrupted tool batch.
        A cold shutdown then stops the pool's loop with every step mid-way, as
        a kill does (their claims and leases are recovered after a lease;
        docs/deploy.md); to stop one run's steps, cancel the run
        (``lattice cancel``), which its steps obey."""


class AsyncioPool(BasePool):
    """Celery pool: every task in a greenlet on one asyncio event loop (module doc)."""

    body_can_be_buffer = True
    signal_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: dict[Future[Any], StepResult] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self.tool_executor: ThreadPoolExecutor | None = None

    def on_start(self) -> None:
        global _pool_loop
        loop = asyncio.new_event_loop()
        # asyncio.to_thread (sync tool handlers, SQL stores) gets as many threads as
        # steps may be in flight, created as needed (asyncio's default is min(32, CPUs + 4))
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=max(32, self.num_processes), thread_name_prefix="lattice-blocking")
        )
        # the steps' blocking tool handlers get threads of their own (as many as the steps in
        # flight may run at once: each runs up to MAX_CONCURRENT_CALLS calls together; made as
        # needed): however many block, the loop's default executor stays free for its DNS
        # lookups and the SQL mailboxes' calls
        self.tool_executor = ThreadPoolExecutor(
            max_workers=max(32, self.num_processes * MAX_CONCURRENT_CALLS), thread_name_prefix="lattice-tool"
        )
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            while not self._stopping:
                try:
                    loop.run_forever()
                except BaseException:  # noqa: BLE001 - the loop of every step must outlive any one
                    # a SystemExit / KeyboardInterrupt raised in a step's asyncio task
                    # propagates out of run_forever (asyncio re-raises them): the task
                    # got it; the loop goes on serving every other step
                    logger.exception("a step raised a BaseException on the pool loop; the loop goes on")

        self._thread = threading.Thread(target=serve, name="lattice-asyncio-pool", daemon=True)
        self._thread.start()
        started.wait()
        self.loop = _pool_loop = loop
        _tool_executors[loop] = self.tool_executor

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> ApplyResult:
        if self.loop is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("AsyncioPool.on_apply(): the pool's event loop is not running")
        future = asyncio.run_coroutine_threadsafe(
            run_in_greenlet(apply_target, target, args, kwargs, callback, accept_callback), self.loop
        )
        result = StepResult(future)
        with self._lock:
            self._running[future] = result  # held until done: Celery keeps a weak reference
        future.add_done_callback(self._done)
        return result

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)
        if not future.cancelled() and future.exception() is not None:
            # apply_target hands task errors to Celery's callbacks; what reaches here
            # escaped them (a callback itself failed)
            logger.error("task greenlet failed", exc_info=future.exception())

    def on_stop(self) -> None:
        """Warm shutdown: wait for the running tasks, then stop the loop. In a
        cold shutdown (Celery's ``on_cold_shutdown`` sets
        ``worker.state.should_terminate`` and then stops the pool, expecting
        its tasks terminated): stop the loop now, as :meth:`on_terminate`."""
        if worker_state.should_terminate:
            self._stop_loop()
            return
        with self._lock:
            running = list(self._running)
        while running and self._thread is not None and self._thread.is_alive():
            running = list(wait_futures(running, timeout=1.0).not_done)
        self._stop_loop()

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Celery's per-task termination (cold shutdown, ``revoke(terminate=True)``)
        signals the task's process; every task of this pool runs in the
        worker's own process (``pid``), so nothing is signalled (see
        :meth:`StepResult.terminate`). ``BasePool`` raises
        ``NotImplementedError`` here, which made a cold shutdown an
        "Unrecoverable error" that then waited for every running step."""

    def on_terminate(self) -> None:
        """Cold shutdown: stop the loop now (running tasks are abandoned; their
        messages are redelivered and their claims recovered by lease)."""
        self._stop_loop()

    def _stop_loop(self) -> None:
        global _pool_loop
        self._stopping = True
        loop, self.loop = self.loop, None
        if loop is not None:
            _tool_executors.pop(loop, None)
        if self.tool_executor is not None:
            self.tool_executor.shutdown(wait=False, cancel_futures=True)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            if self._thread is None or not self._thread.is_alive():
                loop.close()
        if _pool_loop is loop:
            _pool_loop = None

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        with self._lock:
            running = len(self._running)
        info.update({"max-concurrency": self.limit, "running": running, "processes": [os.getpid()]})
        return info

    @property
    def num_processes(self) -> int:
        return int(self.limit or 1)


__all__ = [
    "POOL_PATH",
    "AsyncioPool",
    "await_coroutine",
    "in_pool_loop",
    "in_task_greenlet",
    "run_in_greenlet",
    "tool_executor",
]
