"""One asyncio event loop per worker process (per thread), for Celery tasks.

Celery tasks are synchronous; the agent loop and the Redis clients are
asyncio. A worker process keeps **one** event loop and runs every task's
coroutine on it with ``loop.run_until_complete``; nothing asyncio is ever
shared between two loops (redis-py asyncio connections are bound to the loop
that opened them -- the classic "attached to a different loop" failure).
Design: docs/architecture.md, "Async inside Celery".

The loop is kept per *thread* so the reaper thread (which has its own loop)
and a ``threads`` pool never touch the main loop. After a fork (Celery's
prefork pool) :func:`reset_after_fork` must be called in the child: the loop
object inherited from the parent is unusable there.

Shared mode (``LATTICE_WORKER_LOOP=shared``, measured against the default in
``bench/distributed.py``): every task thread hands its coroutine to **one**
event loop running in a daemon thread of the process
(``asyncio.run_coroutine_threadsafe``) and blocks until it ends, so all tasks
of the process share that loop's Redis connection pools and its batched
writer. A tool or hook that blocks (no ``await``) then stalls every task of
the process, not only its own: the default is one loop per thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_local = threading.local()
_reset_hooks: list[Callable[[], None]] = []

LOOP_MODE_ENV = "LATTICE_WORKER_LOOP"
"""``thread`` (default: one event loop per task thread) or ``shared`` (one loop
per process, in its own thread; see the module doc)."""

_shared_lock = threading.Lock()
_shared: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None


def loop_mode() -> str:
    """``"thread"`` or ``"shared"`` (``LATTICE_WORKER_LOOP``); raises ``ValueError`` otherwise."""
    mode = os.environ.get(LOOP_MODE_ENV, "thread").strip().lower() or "thread"
    if mode not in ("thread", "shared"):
        raise ValueError(f"{LOOP_MODE_ENV} must be 'thread' or 'shared', got {mode!r}")
    return mode


def shared_loop() -> asyncio.AbstractEventLoop:
    """The process's shared event loop (started in a daemon thread on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0].is_closed() or not _shared[1].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(loop,), name="lattice-shared-loop", daemon=True)
            thread.start()
            _shared = (loop, thread)
        return _shared[0]


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def in_shared_mode() -> bool:
    """Whether task coroutines run on the shared loop (see :func:`loop_mode`)."""
    return loop_mode() == "shared"


def get_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, created on first use (never closed by us)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on this thread's loop and return its result.

    Raises ``RuntimeError`` when called from inside a running event loop (a
    Celery task body is never called from one; tests call the async bodies
    directly instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError(
            "lattice_worker.runtime.loops.run() called from inside a running event loop; await the coroutine"
        )
    if in_shared_mode():
        return asyncio.run_coroutine_threadsafe(coro, shared_loop()).result()
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
    global _shared
    _local.loop = None
    _shared = None  # its thread did not survive the fork
    for hook in list(_reset_hooks):
        hook()
    return get_loop()


__all__ = [
    "LOOP_MODE_ENV",
    "get_loop",
    "in_shared_mode",
    "loop_mode",
    "on_reset",
    "reset_after_fork",
    "run",
    "shared_loop",
]
