"""Running a Celery task's coroutine: on the asyncio pool's loop, or on the thread's own loop.

Celery tasks are synchronous; the agent loop and the Redis clients are
asyncio. :func:`run` runs a task body's coroutine:

* in a task of the :class:`~lattice_worker.runtime.worker.aio_pool.AsyncioPool`
  (``lattice worker``'s default pool), on the pool's one event loop, where
  every step of the process runs (the task's greenlet waits meanwhile);
* otherwise (``--pool threads``, ``--pool prefork``, ``--pool solo``, the
  reaper thread), on an event loop kept per *thread* and reused for every task
  of that thread (``loop.run_until_complete``).

Nothing asyncio is ever shared between two loops (redis-py asyncio
connections are bound to the loop that opened them -- the classic "attached
to a different loop" failure). Design: docs/architecture.md, "Async inside Celery".

After a fork (Celery's prefork pool) :func:`reset_after_fork` must be called
in the child: the loop object inherited from the parent is unusable there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from . import aio_pool

T = TypeVar("T")

_local = threading.local()
_reset_hooks: list[Callable[[], None]] = []


def get_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, created on first use (never closed by us)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result (see the module doc for
    which loop runs it).

    Raises ``RuntimeError`` when called from inside a running event loop other
    than through an ``AsyncioPool`` task (tests call the async bodies directly)."""
    if aio_pool.in_task_greenlet():
        return aio_pool.await_coroutine(coro)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError(
            "lattice_worker.runtime.worker.loops.run() called from inside a running event loop; await the coroutine"
        )
    loop = get_loop()
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)


def on_reset(hook: Callable[[], None]) -> None:
    """Register ``hook`` to run in :func:`reset_after_fork` (drop per-loop caches)."""
    _reset_hooks.append(hook)


def reset_after_fork() -> asyncio.AbstractEventLoop:
    """Forget the loop inherited from a parent process and create a fresh one
    for this process's main thread; per-loop caches registered with
    :func:`on_reset` are dropped too. Returns the new loop."""
    _local.loop = None
    for hook in list(_reset_hooks):
        hook()
    return get_loop()


__all__ = ["get_loop", "on_reset", "reset_after_fork", "run"]
