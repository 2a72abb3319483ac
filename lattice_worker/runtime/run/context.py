"""What the worker-side steps share, per event loop: the stores and the services built on them.

One :class:`WorkerContext` is used per event loop (the worker process's task
loop, the reaper thread's own loop): its stores and services create their
asyncio Redis clients lazily *per loop*, so nothing asyncio is shared between
loops. It holds no step logic; each service has one role:

* :attr:`WorkerContext.writer` -- the batched run writer (:mod:`.writer`);
* :attr:`WorkerContext.events` -- the event emitter (:mod:`.events`);
* :attr:`WorkerContext.steps` -- the next steps as Celery tasks (:mod:`.steps`);
* :attr:`WorkerContext.links` -- which run waits for a work item (:mod:`.work_items`);
* :attr:`WorkerContext.usage` -- a run's token usage (:mod:`.usage`);
* :attr:`WorkerContext.keys` -- the worker-owned key names (:mod:`.keys`).

Helpers that need one of them take that one (a ``FencedHistoryStore`` the
writer, ``close_unread_reports`` the mailbox, a ``LeadLease`` the run store).
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from lattice_client.runstore import RunStore
from lattice_client.settings import LatticeSettings
from lattice_mailbox.connections import async_redis

from .events import EventEmitter
from .keys import WorkerKeys
from .steps import StepSender, TaskSender
from .usage import UsageCounter
from .work_items import WorkItemLinks
from .writer import RunWriter


def default_worker_id() -> str:
    """``"<host>:<pid>:<short random>"`` -- recorded as ``claimed_by`` on claims."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerContext:
    """The stores and services of one event loop (see the module doc).

    Attributes:
        settings: the :class:`~lattice_client.settings.LatticeSettings`.
        registry: the :class:`~lattice_worker.runtime.worker.registry.TeamRegistry` of this process.
        mailbox: the leased mailbox store (``registry.mailbox``).
        runs: the :class:`~lattice_client.runstore.RunStore`.
        send_task: how the next steps are enqueued (see :data:`~.steps.TaskSender`).
        worker_id: this process's id, recorded on claims.
    """

    settings: LatticeSettings
    registry: Any
    mailbox: Any
    runs: RunStore
    send_task: TaskSender
    worker_id: str = field(default_factory=default_worker_id)
    keys: WorkerKeys = field(init=False, repr=False)
    writer: RunWriter = field(init=False, repr=False)
    events: EventEmitter = field(init=False, repr=False)
    steps: StepSender = field(init=False, repr=False)
    links: WorkItemLinks = field(init=False, repr=False)
    usage: UsageCounter = field(init=False, repr=False)
    lead_tools: dict[str, list[Any]] = field(default_factory=dict, repr=False)
    """The lead's member tools per team (stateless: built once per team)."""
    _client: Any = field(default=None, repr=False)
    _client_loop: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.keys = WorkerKeys(self.settings.key_prefix)
        self.writer = RunWriter(self.settings.state_url, self.settings.max_run_events)
        self.events = EventEmitter(self.runs, self.writer)
        self.steps = StepSender(self.send_task, self.settings.key_prefix)
        self.links = WorkItemLinks(self.keys, self.redis)
        self.usage = UsageCounter(self.keys, self.writer)

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self.settings.key_prefix

    def client(self) -> Any:
        """A ``redis.asyncio`` client on the broker for the running loop, shared by
        the history stores this context builds (one connection pool per loop,
        not one per run). Bytes responses."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = async_redis(self.settings.state_url)
            self._client_loop = loop
        return self._client

    async def redis(self) -> Any:
        """The broker's ``redis.asyncio`` client for the running loop (``decode_responses=True``)."""
        return await self.runs.redis()

    async def aclose(self) -> None:
        """Write what is queued, then close the clients of the running loop."""
        try:
            await self.writer.flush()
        finally:
            await self.writer.aclose()
            await self.runs.aclose()


__all__ = ["WorkerContext", "default_worker_id"]
