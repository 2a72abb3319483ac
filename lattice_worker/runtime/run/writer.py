"""The worker's batched run writer: run events and queued commands, in order, in few round trips.

A step queues its run events (:meth:`RunWriter.queue_events`, from the
:class:`~lattice_worker.runtime.run.events.EventEmitter`) and the writes that need
no reply (:meth:`RunWriter.queue_write`: history appends, usage increments,
a work-item clear...). They go, in queue order, in one pipeline with the next
write that needs its reply (:meth:`RunWriter.write`: a member call's journal
entry, a registration, a completion, a finish), with a :meth:`RunWriter.sync`
or :meth:`RunWriter.flush`, or at the latest :data:`EVENT_LINGER_SECONDS`
after the first of them was queued (a background task per writer).

One batch is in flight at a time, in queue order. A flush returns once what
was queued when it was called is written (not when the queue is empty: with
many steps in flight it seldom is); after each batch only the flushes it
settled are woken, and the oldest other one, which writes the next batch. A flush writes the queued
batch in the calling task itself (no task hop) when every write and event of
it was queued by that task; a batch holding other tasks' writes goes in a task
of its own that the caller awaits shielded, so a caller cancelled mid-write
neither fails nor drops the others' writes (the cancelled caller's own fate
is then settled by that task too). Script calls in a batch go as ``EVAL`` with their source
(Redis caches the compiled script by its SHA1), so a script missing from the
server's cache never leaves a batch applied out of order.

The writer has its own ``redis.asyncio`` client per event loop
(:func:`lattice_mailbox.connections.async_redis`: a dead idle connection is
replaced before a batch goes on it; a batch whose reply was lost is never sent
blindly again: the run store's tokens decide) and without a per-command socket timeout; each
round trip is bounded by :data:`WRITE_TIMEOUT_SECONDS` instead
(``redis.exceptions.TimeoutError``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_client.runstore import EventFence
from lattice_mailbox.connections import async_redis

logger = logging.getLogger("lattice_worker.runtime")

_APPEND_EVENTS_LUA = (
    resources.files("lattice_client.runstore")
    .joinpath("lua", "append_events.lua")
    .read_text(encoding="utf-8")
)
"""The run store's multi-event append script (``RunStore.append_events``: same checks and
stream format): one call per run stream and batch."""

_APPEND_EVENTS_FENCED_LUA = (
    resources.files("lattice_client.runstore")
    .joinpath("lua", "append_events_fenced.lua")
    .read_text(encoding="utf-8")
)
"""The same under an :class:`~lattice_client.runstore.EventFence` (``RunStore.append_events(..., fence=)``):
one call per run stream, fence and batch."""

WRITE_TIMEOUT_SECONDS = 5.0
"""How long (seconds) one round trip of the run writer may wait for Redis
before it fails with ``redis.exceptions.TimeoutError``."""

EVENT_LINGER_SECONDS = 0.05
"""How long (seconds) a queued run event may wait for others to share its write.
:meth:`RunWriter.flush` (before suspend, completion, finish and at the end of
every task body) writes at once; the linger only bounds how stale a run's
stream can get between those points (a long model call, a long tool)."""

Command = tuple[Any, ...]
"""``(redis method name, *args)``, e.g. ``("hincrby", key, "input_tokens", 3)``
or ``("evalsha", sha, numkeys, *keys, *args)`` (a run-store ``*_call``)."""


@dataclass
class QueuedWrite:
    """Commands written with a batch of run events (see :meth:`RunWriter.queue_write`)."""

    commands: list[Command]
    future: asyncio.Future[list[Any]] | None
    scripts: tuple[str, ...] = ()
    fence: str | None = None
    on_error: Callable[[BaseException], BaseException] | None = None
    owner: Any = None
    """The task that queued it (``asyncio.current_task()``)."""


@dataclass
class _Events:
    """One run stream's events of a batch."""

    record_key: str
    events_key: str
    payloads: list[str]
    fence: EventFence | None = None


_QueuedEvent = tuple[str, str, str, "EventFence | None", Any]
"""A queued event: ``(record key, events key, payload JSON, fence or None, the queuing task)``."""

_SOURCES: dict[str, str] = {}
"""Script sources by SHA1 (filled from the ``scripts`` of queued writes)."""


def _script_source(sha: Any, scripts: tuple[str, ...] | None) -> str | None:
    """The source of the script ``sha`` among ``scripts``, or ``None``."""
    source = _SOURCES.get(sha)
    if source is None and scripts:
        for candidate in scripts:
            _SOURCES[hashlib.sha1(candidate.encode("utf-8")).hexdigest()] = candidate
        source = _SOURCES.get(sha)
    return source


class RunWriter:
    """The batched writer of one event loop (see the module doc).

    Args:
        redis_url: the broker's ``redis://`` URL (the run store's server).
        max_run_events: approximate length bound of each run's event stream.
    """

    def __init__(self, redis_url: str, max_run_events: int) -> None:
        self.redis_url = redis_url
        self.max_run_events = max_run_events
        self._client: Redis | None = None
        self._client_loop: Any = None
        # (record key, events key, payload, fence, the queuing task) or a queued write
        self._queue: list[_QueuedEvent | QueuedWrite] = []
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._flushing = 0
        self._busy = False
        # what was ever queued / written (counts of queued items): a flush waits until what
        # was queued when it was called is written, not until the queue is empty (under load
        # it never is), and a written batch wakes only the flushes it settled plus one that
        # writes the next batch, not every waiting flush (1,000 steps in flight made that
        # quadratic: bench/distributed.py (b))
        self._queued = 0
        self._written = 0
        self._idle: list[tuple[int, asyncio.Future[None]]] = []
        self._errors: dict[str, BaseException] = {}

    def _redis(self) -> Redis:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = async_redis(self.redis_url, socket_timeout=None)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the writer's client (of the running loop)."""
        client, self._client = self._client, None
        if client is not None and self._client_loop is asyncio.get_running_loop():
            await client.aclose()

    # -- queueing -------------------------------------------------------------------------

    def queue_events(
        self, record_key: str, events_key: str, payload: str, fence: EventFence | None = None
    ) -> None:
        """Queue one encoded event (JSON text) for the run stream ``events_key``
        of the run record ``record_key``; written with the next batch. Under a
        ``fence`` (of that run) it is written only while the fence holds (a
        refused one is logged, not raised: events are observational)."""
        self._queue.append((record_key, events_key, payload, fence, asyncio.current_task()))
        self._queued += 1
        self._start()

    def queue_write(
        self,
        commands: list[Command],
        *,
        scripts: tuple[str, ...] = (),
        fence: str | None = None,
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> QueuedWrite:
        """Queue ``commands`` to be written with the next batch, in order with the
        queued events and writes; nothing waits. ``scripts``: the Lua sources of
        their ``evalsha`` commands (sent as ``EVAL`` with them). A failure goes
        through ``on_error`` (which may map it), is logged, and is kept for
        :meth:`sync` under ``fence``. Returns the queued write (see :meth:`still_queued`)."""
        op = QueuedWrite(commands, None, scripts, fence, on_error, asyncio.current_task())
        self._queue.append(op)
        self._queued += 1
        self._start()
        return op

    def still_queued(self, op: QueuedWrite) -> bool:
        """Whether ``op`` is still queued, not taken by a batch yet, and nothing
        that waits for its reply (a :meth:`write`) was queued after it: its
        ``commands`` may then still be changed in place (a lead segment's
        history append merged into its previous history write)."""
        for queued in reversed(self._queue):
            if queued is op:
                return True
            if isinstance(queued, QueuedWrite) and queued.future is not None:
                return False
        return False

    def last_queued(self, op: QueuedWrite) -> bool:
        """:meth:`still_queued`, and no other write was queued after ``op`` (run
        events may have been: they go to their own streams): ``op``'s commands
        may then grow by what would have been the next write without changing
        the order of the writes."""
        for queued in reversed(self._queue):
            if queued is op:
                return True
            if isinstance(queued, QueuedWrite):
                return False
        return False

    async def write(
        self,
        commands: list[Command],
        *,
        scripts: tuple[str, ...] = (),
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> list[Any]:
        """Write ``commands`` now, in one pipeline after the queued events and
        writes, and return their replies; the first error reply (through
        ``on_error``) is raised. ``scripts``: as for :meth:`queue_write`."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append(QueuedWrite(commands, future, scripts, None, on_error, asyncio.current_task()))
        self._queued += 1
        await self.flush()
        return await future

    async def sync(self, fence: str | None = None) -> None:
        """:meth:`flush`, then raise the first failure of the writes queued under
        ``fence`` since the last ``sync`` of it, if any (once)."""
        await self.flush()
        if fence is not None:
            error = self._errors.pop(fence, None)
            if error is not None:
                raise error

    async def flush(self) -> None:
        """Write everything queued now and wait until it is written (or reported lost)."""
        target = self._queued
        self._flushing += 1
        try:
            while self._written < target:
                if self._busy:  # a batch is in flight: wait for it (and maybe write the next)
                    waiter = asyncio.get_running_loop().create_future()
                    self._idle.append((target, waiter))
                    try:
                        await waiter
                    except BaseException:
                        if not waiter.cancelled() and not self._busy:
                            self._wake_waiters()  # woken to write the next batch: another one does
                        raise
                    continue
                _wake_up(self._wake)  # a lingering background task: nothing left for it
                await self._write_queued(caller=asyncio.current_task())
        finally:
            self._flushing -= 1

    # -- writing --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._background())

    async def _background(self) -> None:
        if not self._flushing:
            await self._linger()  # let what is queued up to the next flush point share one write
        while self._queue and not self._busy:  # (a flush writing meanwhile takes the rest)
            await self._write_queued()

    async def _linger(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(EVENT_LINGER_SECONDS, _wake_up, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    async def _write_queued(self, caller: Any = None) -> None:
        """Write what is queued now. ``caller``: the flushing task; the batch goes in
        it (no task hop) when it queued all of the batch, else in a task of its own,
        awaited shielded (the caller's cancellation leaves it running)."""
        batch, self._queue = self._queue, []
        self._busy = True
        end = self._queued
        if caller is None or all(_owner(op) is caller for op in batch):
            await self._write_settled(batch, end)
            return
        await asyncio.shield(asyncio.get_running_loop().create_task(self._write_settled(batch, end)))

    async def _write_settled(self, batch: list[tuple[str, str, str, Any] | QueuedWrite], end: int) -> None:
        """Write ``batch`` (the items queued up to count ``end``) and settle its writes."""
        try:
            await self._write_batch(batch)
        except BaseException as exc:
            error: BaseException = exc
            if isinstance(exc, Exception):
                logger.warning("could not write a batch of %d run writes", len(batch), exc_info=True)
            else:  # cancelled mid-write (its caller is going away): the writes' fate is unknown
                error = RedisConnectionError("the write was interrupted")
            for op in batch:
                if isinstance(op, QueuedWrite) and (op.future is None or not op.future.done()):
                    self._settle(op, None, error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._busy = False
            self._written = end
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        """After a batch: wake the flushes it settled, and one other (the oldest still
        waiting) to write what was queued meanwhile; the rest wait for that batch."""
        waiting: list[tuple[int, asyncio.Future[None]]] = []
        writer_woken = False
        for target, waiter in self._idle:
            if waiter.done():  # (its flush was cancelled)
                continue
            if target <= self._written:
                waiter.set_result(None)
            elif not writer_woken:
                waiter.set_result(None)
                writer_woken = True
            else:
                waiting.append((target, waiter))
        self._idle = waiting

    async def _write_batch(self, batch: list[_QueuedEvent | QueuedWrite]) -> None:
        """One pipeline for the batch: the queued writes in order, each run
        stream's events in one script call per run of events under the same
        fence (placed where its first event was queued). Only a script call whose source the
        write did not give goes as ``EVALSHA`` (refused with NOSCRIPT when the
        server lacks it: sent again once after loading the write's scripts)."""
        units: list[QueuedWrite | _Events] = []
        streams: dict[tuple[str, str], _Events] = {}
        for op in batch:
            if isinstance(op, QueuedWrite):
                units.append(op)
                continue
            record_key, events_key, payload, fence, _ = op
            group = streams.get((record_key, events_key))
            if group is None or group.fence != fence:  # a stream's events stay in order
                group = streams[(record_key, events_key)] = _Events(record_key, events_key, [], fence)
                units.append(group)
            group.payloads.append(payload)
        client = self._redis()
        lost: list[Exception] = []
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for unit in units:
                if isinstance(unit, _Events):
                    pipe.execute_command("EVAL", *_events_call(unit, self.max_run_events))
                    continue
                for name, *args in unit.commands:
                    source = _script_source(args[0], unit.scripts) if name == "evalsha" else None
                    if source is not None:
                        pipe.execute_command("EVAL", source, *args[1:])
                    else:
                        getattr(pipe, name)(*args)
            results = iter(await _execute(pipe))
            retry: list[QueuedWrite | _Events] = []
            scripts: set[str] = set()
            for unit in units:
                if isinstance(unit, QueuedWrite):
                    replies = [next(results) for _ in unit.commands]
                    error = next((r for r in replies if isinstance(r, Exception)), None)
                    if attempt == 0 and unit.scripts and isinstance(error, NoScriptError):
                        retry.append(unit)
                        scripts.update(unit.scripts)
                    else:
                        self._settle(unit, replies, error)
                    continue
                reply = next(results)
                if isinstance(reply, Exception):
                    lost.extend([reply] * len(unit.payloads))
            if not retry:
                break
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                for source in scripts:
                    await client.script_load(source)
            units = retry
        others = [e for e in lost if not str(e).startswith("FENCED")]
        if len(others) < len(lost):
            logger.info(
                "%d run events refused (this worker no longer holds their run or item)",
                len(lost) - len(others),
            )
        if others:
            logger.warning("%d run events not written: %s", len(others), others[0])

    def _settle(self, op: QueuedWrite, replies: list[Any] | None, error: BaseException | None) -> None:
        if error is not None and op.on_error is not None:
            error = op.on_error(error)
        if op.future is None:
            if error is not None:
                logger.warning("a queued write failed: %s", error)
                if op.fence is not None:
                    if len(self._errors) > 1000:
                        self._errors.clear()
                    self._errors.setdefault(op.fence, error)
        elif not op.future.done():
            if error is None:
                op.future.set_result(replies or [])
            else:
                op.future.set_exception(error)


def _events_call(unit: _Events, max_events: int) -> tuple[Any, ...]:
    """``EVAL`` arguments of one stream's events (fenced when ``unit.fence``)."""
    if unit.fence is None:
        return (_APPEND_EVENTS_LUA, 2, unit.record_key, unit.events_key, max_events, *unit.payloads)
    fence = unit.fence
    keys = (unit.record_key, unit.events_key, fence.key)
    return (_APPEND_EVENTS_FENCED_LUA, 3, *keys, max_events, *fence.args, *unit.payloads)


async def _execute(pipe: Any) -> list[Any]:
    """``pipe.execute(raise_on_error=False)`` within :data:`WRITE_TIMEOUT_SECONDS`
    (error replies in place). redis-py drops a connection interrupted mid-reply."""
    try:
        async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
            return list(await pipe.execute(raise_on_error=False))
    except TimeoutError as exc:
        if isinstance(exc, RedisTimeoutError):
            raise
        raise RedisTimeoutError(f"a run write got no reply within {WRITE_TIMEOUT_SECONDS} s") from None


def _owner(op: _QueuedEvent | QueuedWrite) -> Any:
    return op.owner if isinstance(op, QueuedWrite) else op[4]


def _wake_up(future: Any) -> None:
    if future is not None and not future.done():
        future.set_result(None)


__all__ = ["EVENT_LINGER_SECONDS", "WRITE_TIMEOUT_SECONDS", "Command", "QueuedWrite", "RunWriter"]
