"""Per-process state of a worker: settings, the team registry, and one
:class:`~lattice_worker.runtime.run.context.WorkerContext` per thread (event loop).

The registry is built once per process from the settings' mailbox URL and
the team references in ``LATTICE_WORKER_TEAMS`` (``lattice worker`` sets it
before Celery starts, so pool processes load the same teams however they are
started). Contexts are per thread because each thread has its own event loop
(:mod:`lattice_worker.runtime.worker.loops`; the asyncio pool's steps all run on its
loop thread); after a fork they are dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from lattice_client.runstore import RunStore
from lattice_client.settings import LatticeSettings, get_settings
from lattice_mailbox import mailbox_from_url

from ..run.context import WorkerContext, default_worker_id
from ..run.steps import TaskSender
from . import loops
from .registry import TeamRegistry, refs_from_env

_lock = threading.RLock()
_settings: LatticeSettings | None = None
_registry: TeamRegistry | None = None
_local = threading.local()
_sender: TaskSender | None = None
_worker_id: str | None = None


def settings() -> LatticeSettings:
    """The process's settings (``LATTICE_*`` environment variables, read once)."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = get_settings()
        return _settings


def make_mailbox(s: LatticeSettings) -> Any:
    """The mailbox store of ``s`` (``mailbox_url``, key prefix, size bound), built
    exactly as the client builds it (on SQL stores the key prefix selects the tables)."""
    return mailbox_from_url(s.mailbox_url, prefix=s.key_prefix, max_message_bytes=s.max_message_bytes)


def registry() -> TeamRegistry:
    """The process's team registry; the first call loads ``LATTICE_WORKER_TEAMS``."""
    global _registry
    with _lock:
        if _registry is None:
            reg = TeamRegistry(make_mailbox(settings()))
            for ref in refs_from_env():
                reg.load(ref)
            _registry = reg
        return _registry


def set_task_sender(sender: TaskSender) -> None:
    """How follow-up tasks are sent (``celery_app`` installs ``app.send_task``)."""
    global _sender
    _sender = sender


def worker_id() -> str:
    """This process's worker id (recomputed after a fork)."""
    global _worker_id
    with _lock:
        if _worker_id is None:
            _worker_id = default_worker_id()
        return _worker_id


def context() -> WorkerContext:
    """This thread's :class:`WorkerContext` (created on first use): one per event
    loop, so all the steps of an ``AsyncioPool`` process share the pool loop's."""
    ctx: WorkerContext | None = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = new_context()
        _local.ctx = ctx
    return ctx


def new_context(sender: Callable[[str, list[Any], str], None] | None = None) -> WorkerContext:
    """A fresh context (each event loop has its own: the task loop, the reaper thread's)."""
    s = settings()
    reg = registry()
    send = sender or _sender
    if send is None:
        raise RuntimeError("no task sender installed: import lattice_worker.runtime.worker.celery_app first")
    return WorkerContext(
        settings=s,
        registry=reg,
        mailbox=reg.mailbox,
        runs=RunStore(s.state_url, s.key_prefix, max_events=s.max_run_events),
        send_task=send,
        worker_id=worker_id(),
    )


def _reset() -> None:
    global _worker_id
    _local.ctx = None
    _worker_id = None


loops.on_reset(_reset)

__all__ = [
    "context",
    "make_mailbox",
    "new_context",
    "registry",
    "set_task_sender",
    "settings",
    "worker_id",
]
