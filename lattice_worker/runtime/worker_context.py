"""What the worker-side task bodies share: settings, stores, the team registry,
and the way to enqueue follow-up tasks.

DESIGN.md section 5. One :class:`WorkerContext` is used per event loop (the
worker process's loop, or the reaper thread's own loop): the stores it holds
create their asyncio Redis clients lazily *per loop*, so nothing asyncio is
shared between loops.

Follow-up tasks go through ``send_task(name, args, queue)`` -- Celery's
``app.send_task`` in a worker; tests pass a collector and run the bodies
themselves. Doorbells are ``lattice.deliver(mailbox_id)`` on queue
``<prefix>.<team>.<member>``; resumes are ``lattice.resume_lead(run_id)`` and
new (child) runs ``lattice.run_lead(run_id)`` on ``<prefix>.<team>.lead``.

Redis keys owned by the worker side (``P`` = key prefix; run keys share the
run store's hash tag ``{run:<run_id>}``):

==================================  ======  =====================================
key                                 type    content
==================================  ======  =====================================
``P:run:{run:<id>}:history``        list    the lead's conversation (one JSON message per element)
``P:run:{run:<id>}:usage``          hash    token usage summed over the run's lead segments
``P:workitem:<work_item_id>``       string  JSON ``{"run_id", "team"}``: the run waiting for the item
``P:workitem:<id>:early``           string  an item's outcome, when it finished before its run registered it
``P:session:<mailbox_id>``          list    a session member's conversation
``P:reaper:lock``                   string  the reaper guard (``SET NX PX``)
``P:reaper:rung:<mailbox_id>``      string  "re-rung recently" marker of the lost-doorbell check
``P:reaper:resumed:<run_id>``       string  "re-enqueued recently" marker of the stale-resume check
==================================  ======  =====================================
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK, queue_name
from lattice_client.runstore import RunStore
from lattice_client.settings import LatticeSettings

from ..team.ids import split_mailbox_id

logger = logging.getLogger("lattice_worker.runtime")

TaskSender = Callable[[str, list[Any], str], None]
"""``send_task(task_name, args, queue)``: enqueue one Celery task (sync)."""

_APPEND_EVENTS_LUA = (
    resources.files("lattice_client.runstore")
    .joinpath("lua", "append_events.lua")
    .read_text(encoding="utf-8")
)
"""The run store's multi-event append script (``RunStore.append_events``: same checks and
stream format), pipelined by the event writer: one call per run stream and batch."""

RUN_KEY_TTL_SECONDS = 7 * 24 * 3600
"""How long (seconds) a run's history, usage and work-item links are kept after their last write."""

WRITE_TIMEOUT_SECONDS = 5.0
"""How long (seconds) one round trip of the run writer may wait for Redis (as
redis-py's default per-command socket timeout) before it fails with ``TimeoutError``."""

EVENT_LINGER_SECONDS = 0.05
"""How long (seconds) a queued run event may wait for others to share its write.
:meth:`WorkerContext.flush_events` (before suspend, completion, finish and at the
end of every task body) writes at once; the linger only bounds how stale a
run's stream can get between those points (a long model call, a long tool)."""


def default_worker_id() -> str:
    """``"<host>:<pid>:<short random>"`` -- recorded as ``claimed_by`` on claims."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerContext:
    """Everything a task body needs.

    Attributes:
        settings: the :class:`~lattice_client.settings.LatticeSettings`.
        registry: the :class:`~lattice_worker.runtime.registry.TeamRegistry` of this process.
        mailbox: the leased mailbox store (``registry.mailbox``).
        runs: the :class:`~lattice_client.runstore.RunStore`.
        send_task: how follow-up tasks are enqueued (see :data:`TaskSender`).
        worker_id: this process's id, recorded on claims.
    """

    settings: LatticeSettings
    registry: Any
    mailbox: Any
    runs: RunStore
    send_task: TaskSender
    worker_id: str = field(default_factory=default_worker_id)
    _parents: dict[str, tuple[str, str, str] | None] = field(default_factory=dict, repr=False)
    _client: Any = field(default=None, repr=False)
    _client_loop: Any = field(default=None, repr=False)
    _write_client: Any = field(default=None, repr=False)
    _write_client_loop: Any = field(default=None, repr=False)
    _write_conn: Any = field(default=None, repr=False)
    _events: list[tuple[str, str, str] | _Write] = field(default_factory=list, repr=False)
    _writer: Any = field(default=None, repr=False)
    _wake: Any = field(default=None, repr=False)
    _flushing: int = field(default=0, repr=False)
    _busy: bool = field(default=False, repr=False)
    _idle: list[Any] = field(default_factory=list, repr=False)
    _write_errors: dict[str, BaseException] = field(default_factory=dict, repr=False)
    lead_tools: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    @property
    def prefix(self) -> str:
        return self.settings.key_prefix

    # -- keys ---------------------------------------------------------------------------

    def history_key(self, run_id: str) -> str:
        """The Redis list holding run ``run_id``'s lead conversation."""
        return f"{self.prefix}:run:{{run:{run_id}}}:history"

    def usage_key(self, run_id: str) -> str:
        """The Redis hash summing run ``run_id``'s token usage."""
        return f"{self.prefix}:run:{{run:{run_id}}}:usage"

    def work_item_key(self, work_item_id: str) -> str:
        """The Redis string linking a work item to its run."""
        return f"{self.prefix}:workitem:{work_item_id}"

    def early_outcome_key(self, work_item_id: str) -> str:
        """Where a member leaves the outcome of an item finished before its run registered it."""
        return f"{self.prefix}:workitem:{work_item_id}:early"

    def session_key(self, mailbox_id: str) -> str:
        """The Redis list holding a session member's conversation."""
        return f"{self.prefix}:session:{mailbox_id}"

    def client(self) -> Any:
        """A ``redis.asyncio`` client on the broker for the running loop, shared by
        the history stores this context builds (one connection pool per loop,
        not one per run). Bytes responses."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            from redis.asyncio import Redis

            self._client = Redis.from_url(self.settings.broker_url)
            self._client_loop = loop
        return self._client

    def _writer_client(self) -> Any:
        """The writer's own ``redis.asyncio`` client for the running loop: no
        per-command socket timeout (redis-py then wraps every send in a task
        and every reply read in a timer); :meth:`_write_batch` bounds each of
        its round trips by :data:`WRITE_TIMEOUT_SECONDS` instead."""
        loop = asyncio.get_running_loop()
        if self._write_client is None or self._write_client_loop is not loop:
            from redis.asyncio import Redis

            self._write_client = Redis.from_url(self.settings.broker_url, socket_timeout=None)
            self._write_client_loop = loop
            self._write_conn = None
        return self._write_client

    async def redis(self) -> Any:
        """The broker's ``redis.asyncio`` client for the running loop (``decode_responses=True``)."""
        return await self.runs.redis()

    # -- enqueueing ---------------------------------------------------------------------

    def _enqueue(self, task: str, arg: str, queue: str) -> None:
        self.send_task(task, [arg], queue)

    def ring(self, mailbox_id: str) -> None:
        """Ring the doorbell of ``mailbox_id``: ``lattice.deliver`` on its member queue."""
        team, member = split_mailbox_id(mailbox_id)
        self._enqueue(DELIVER_TASK, mailbox_id, queue_name(self.prefix, team, member))

    def enqueue_resume(self, run_id: str, team: str) -> None:
        """``lattice.resume_lead(run_id)`` on ``team``'s lead queue."""
        self._enqueue(RESUME_LEAD_TASK, run_id, queue_name(self.prefix, team, "lead"))

    def enqueue_run_lead(self, run_id: str, team: str) -> None:
        """``lattice.run_lead(run_id)`` on ``team``'s lead queue (child runs)."""
        self._enqueue(RUN_LEAD_TASK, run_id, queue_name(self.prefix, team, "lead"))

    # -- work item links ----------------------------------------------------------------

    async def link_work_items(self, run_id: str, team: str, work_item_ids: list[str]) -> None:
        """Remember which run waits for each work item (read by ``deliver`` and the reaper)."""
        if not work_item_ids:
            return
        client = await self.redis()
        async with client.pipeline(transaction=False) as pipe:
            for wid in work_item_ids:
                name, *args = self.link_command(run_id, team, wid)
                getattr(pipe, name)(*args)
            await pipe.execute()

    def link_command(self, run_id: str, team: str, work_item_id: str) -> tuple[Any, ...]:
        """The command of :meth:`link_work_items` for one item, as ``(redis method, *args)``
        (for :meth:`write` / :meth:`queue_write`)."""
        value = json.dumps({"run_id": run_id, "team": team})
        return ("set", self.work_item_key(work_item_id), value, RUN_KEY_TTL_SECONDS)

    async def run_of(self, work_item_id: str | None) -> tuple[str, str] | None:
        """``(run_id, team)`` waiting for ``work_item_id``, or ``None`` (a message
        that is no run's work item, e.g. a ``team_send`` between members)."""
        if not work_item_id:
            return None
        client = await self.redis()
        raw = await client.get(self.work_item_key(work_item_id))
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return str(data["run_id"]), str(data["team"])
        except (ValueError, KeyError, TypeError):
            logger.warning("malformed work item link %s: %r", work_item_id, raw)
            return None

    async def save_early_outcome(self, work_item_id: str, outcome: dict[str, Any]) -> None:
        """Keep the outcome of an item its run has not registered yet (see
        :func:`lattice_worker.runtime.member_run.complete_work_item`)."""
        client = await self.redis()
        await client.set(self.early_outcome_key(work_item_id), json.dumps(outcome), ex=RUN_KEY_TTL_SECONDS)

    async def early_outcomes(self, work_item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """``{work_item_id: outcome}`` of the given items that finished before registration."""
        if not work_item_ids:
            return {}
        client = await self.redis()
        raw = await client.mget([self.early_outcome_key(w) for w in work_item_ids])
        return {w: json.loads(r) for w, r in zip(work_item_ids, raw, strict=True) if r}

    # -- events and usage ---------------------------------------------------------------

    async def emit(self, run_id: str, event: Any) -> None:
        """Queue ``event`` (an SDK/team event model or dict) for the run's event
        stream; for a child run (a nested team) also for every ancestor's
        stream, wrapped as ``agent_message`` of the member the child run serves.

        Events are written in order by one background writer per context, in
        pipelined batches (one ``RunStore.append_events`` script call per stream), so the
        agent loop does not wait for each write: a batch is written
        :data:`EVENT_LINGER_SECONDS` after its first event, or at once by
        :meth:`flush_events`, which waits for it. Token-level ``stream_event``
        events (also wrapped ones) are not stored: they would multiply the
        stream's size for no reader's benefit.
        Stream failures are logged, never raised (events are observational)."""
        data: dict[str, Any] | None = None
        payload = _model_json(event)  # a model's JSON straight from pydantic: the same text
        if payload is None:
            data = _event_dict(event)
            if _is_stream_delta(data):
                return
        elif payload == "":  # a token-level stream event
            return
        current = run_id
        depth = 0
        while current and depth < 16:
            try:
                if payload is None:
                    assert data is not None
                    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
                keys = self.runs.keys(current)
            except ValueError:
                logger.warning(
                    "could not queue a %s event for run %s",
                    getattr(event, "type", None),
                    current,
                    exc_info=True,
                )
                return
            self._events.append((keys.record, keys.events, payload))
            try:
                parent = await self._parent_of(current)
            except Exception:
                logger.warning("could not read the parent of run %s", current, exc_info=True)
                parent = None
            if parent is None:
                break
            parent_run, parent_team, member = parent
            if data is None:
                data = _event_dict(event)
            payload = None
            data = {
                "type": "agent_message",
                "team": parent_team,
                "member": member,
                "mailbox": f"{parent_team}::{member}",
                "message": data,
            }
            current = parent_run
            depth += 1
        self._start_writer()

    def _start_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_events())

    async def _write_events(self) -> None:
        if not self._flushing:
            await self._linger()  # let the events up to the next flush point share one write
        while self._events and not self._busy:  # (a flush writing meanwhile takes the rest)
            await self._write_queued()

    async def _write_queued(self) -> None:
        """Write everything queued now as one batch. One batch is in flight at
        a time (``_busy``), so batches reach Redis in the order they were queued."""
        batch, self._events = self._events, []
        self._busy = True
        try:
            await self._write_batch(batch)
        except BaseException as exc:
            error: BaseException = exc
            if isinstance(exc, Exception):
                logger.warning("could not write %d run events", len(batch), exc_info=True)
            else:  # cancelled mid-write (its caller is going away): the writes' fate is unknown
                error = RedisConnectionError("the write was interrupted")
            for op in batch:
                if isinstance(op, _Write) and (op.future is None or not op.future.done()):
                    self._settle(op, None, error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._busy = False
            idle, self._idle = self._idle, []
            for waiter in idle:
                _wake_up(waiter)

    async def _write_batch(self, batch: list[tuple[str, str, str] | _Write]) -> None:
        """One pipeline for the batch: the command batches in order, each run
        stream's events in one script call (in their order; placed where the
        stream's first event of the batch was queued). Script calls go with
        their source (``EVAL``; Redis caches the compiled script by its SHA1),
        so no call of a batch is refused with NOSCRIPT while later ones run --
        the batch is applied in order or not at all per call. Only a call whose
        source the write did not give goes as ``EVALSHA`` (refused with NOSCRIPT
        when the server lacks it: sent again once after loading the write's scripts)."""
        units: list[_Write | _Events] = []
        streams: dict[tuple[str, str], _Events] = {}
        for op in batch:
            if isinstance(op, _Write):
                units.append(op)
                continue
            record_key, events_key, payload = op
            group = streams.get((record_key, events_key))
            if group is None:
                group = streams[(record_key, events_key)] = _Events(record_key, events_key, [])
                units.append(group)
            group.payloads.append(payload)
        client = self._writer_client()
        lost: list[Exception] = []
        for attempt in range(2):
            # (args, parse options) per command: script calls as they go on the wire,
            # other commands built by redis-py's methods (their arguments and reply parsing)
            stack: list[tuple[Any, Any]] = []
            pipe: Any = None
            for unit in units:
                if isinstance(unit, _Write):
                    for name, *args in unit.commands:
                        if name == "evalsha":
                            # sent with its source (EVAL): a batch never meets NOSCRIPT halfway,
                            # which would leave its later calls applied before the refused one
                            source = _script_source(args[0], unit.scripts)
                            if source is not None:
                                stack.append((("EVAL", source, *args[1:]), {}))
                            else:
                                stack.append((("EVALSHA", *args), {}))
                            continue
                        if pipe is None:
                            pipe = client.pipeline(transaction=False)
                        getattr(pipe, name)(*args)
                        stack.append(pipe.command_stack.pop())
                else:
                    stack.append(
                        (
                            (
                                "EVAL",
                                _APPEND_EVENTS_LUA,
                                2,
                                unit.record_key,
                                unit.events_key,
                                self.settings.max_run_events,
                                *unit.payloads,
                            ),
                            {},
                        )
                    )
            pool = client.connection_pool
            if self._write_conn is None:  # the writer's own connection (one batch at a time)
                self._write_conn = await pool.get_connection()
            else:  # as the pool checks a connection it hands out: closed or dirty -> reconnect
                await pool.ensure_connection(self._write_conn)
            results = iter(await _round_trip(client, self._write_conn, stack))
            retry: list[_Write | _Events] = []
            scripts: set[str] = set()
            for unit in units:
                if isinstance(unit, _Write):
                    replies = [next(results) for _ in unit.commands]
                    error = next((r for r in replies if isinstance(r, Exception)), None)
                    if attempt == 0 and unit.scripts and isinstance(error, NoScriptError):
                        retry.append(unit)
                        scripts.update(unit.scripts)
                    else:
                        self._settle(unit, replies, error)
                    continue
                reply = next(results)
                if attempt == 0 and isinstance(reply, NoScriptError):
                    retry.append(unit)
                    scripts.add(_APPEND_EVENTS_LUA)
                elif isinstance(reply, Exception):
                    lost.extend([reply] * len(unit.payloads))
            if not retry:
                break
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                for source in scripts:
                    await client.script_load(source)
            units = retry
        if lost:
            logger.warning("%d run events not written: %s", len(lost), lost[0])

    def _settle(self, op: _Write, replies: list[Any] | None, error: BaseException | None) -> None:
        if error is not None and op.on_error is not None:
            error = op.on_error(error)
        if op.future is None:
            if error is not None:
                logger.warning("a queued write failed: %s", error)
                if op.fence is not None:
                    if len(self._write_errors) > 1000:
                        self._write_errors.clear()
                    self._write_errors.setdefault(op.fence, error)
        elif not op.future.done():
            if error is None:
                op.future.set_result(replies or [])
            else:
                op.future.set_exception(error)

    def queue_write(
        self,
        commands: list[tuple[Any, ...]],
        *,
        scripts: tuple[str, ...] = (),
        fence: str | None = None,
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> _Write:
        """Queue ``commands`` (``(redis method name, *args)``) to be written
        with the next batch of run events, in order with them and with other
        queued writes; nothing waits. ``scripts``: the Lua sources of their
        ``EVALSHA`` commands, loaded when the server answers NOSCRIPT (the
        commands are then sent again: keep them idempotent beside a refused
        script). A failure goes through ``on_error`` (which may map it), is
        logged, and is kept for :meth:`sync` under ``fence``. Returns the
        queued write (see :meth:`still_queued`)."""
        op = _Write(commands, None, scripts, fence, on_error)
        self._events.append(op)
        self._start_writer()
        return op

    def still_queued(self, op: Any) -> bool:
        """Whether ``op`` (what :meth:`queue_write` returned) is still queued,
        not taken by the writer yet, and nothing that waits for its reply
        (a :meth:`write`) was queued after it: its ``commands`` may then still
        be changed in place (a lead segment's history append merged into its
        previous history write, see ``FencedHistoryStore``)."""
        for queued in reversed(self._events):
            if queued is op:
                return True
            if isinstance(queued, _Write) and queued.future is not None:
                return False
        return False

    async def write(
        self,
        commands: list[tuple[Any, ...]],
        *,
        scripts: tuple[str, ...] = (),
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> list[Any]:
        """Write ``commands`` now, in one pipeline with the queued events and
        writes (after them), and return their replies; the first error reply
        (through ``on_error``) is raised. ``scripts``: as for :meth:`queue_write`."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._events.append(_Write(commands, future, scripts, None, on_error))
        await self.flush_events()
        return await future

    async def sync(self, fence: str | None = None) -> None:
        """Write everything queued now (:meth:`flush_events`), then raise the
        first failure of the writes queued under ``fence`` since the last
        ``sync`` of it, if any (once)."""
        await self.flush_events()
        if fence is not None:
            error = self._write_errors.pop(fence, None)
            if error is not None:
                raise error

    async def _linger(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(EVENT_LINGER_SECONDS, _wake_up, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    async def flush_events(self) -> None:
        """Write every queued event now and wait until each is in its stream
        (or was reported lost)."""
        self._flushing += 1
        try:
            while self._events or self._busy:
                if self._busy:  # a batch is in flight (the background writer's): after it
                    waiter = asyncio.get_running_loop().create_future()
                    self._idle.append(waiter)
                    await waiter
                    continue
                _wake_up(self._wake)  # a lingering background writer: nothing left for it
                await self._write_queued()  # written by the caller itself: no task hop
        finally:
            self._flushing -= 1

    def note_parent(self, run_id: str, parent: Any) -> None:
        """Seed the parent cache from a run record's ``parent`` (saves a read)."""
        link = None
        if parent is not None and getattr(parent, "run_id", None):
            team, _, member = parent.mailbox_id.rpartition("::")
            link = (parent.run_id, team, member)
        self._parents[run_id] = link

    async def _parent_of(self, run_id: str) -> tuple[str, str, str] | None:
        if run_id in self._parents:
            return self._parents[run_id]
        record = await self.runs.get(run_id)
        link = None
        if record is not None and record.parent is not None and record.parent.run_id:
            team, _, member = record.parent.mailbox_id.rpartition("::")
            link = (record.parent.run_id, team, member)
        if len(self._parents) > 10_000:
            self._parents.clear()
        self._parents[run_id] = link
        return link

    async def add_usage(
        self,
        run_id: str,
        usage: dict[str, Any] | None,
        *,
        total: bool = False,
        known: dict[str, int] | None = None,
        fence: str | None = None,
    ) -> dict[str, int]:
        """Add one lead segment's token usage to the run's total (nothing is
        written for an all-zero usage). With ``total=True`` returns the run's
        total so far (every key of ``usage`` present, zeros included), else ``{}``.
        Written in the same pipeline as the queued events (which it flushes).
        Raises the Redis error when the write fails.

        ``known``: the run's totals as this segment knows them (read when it
        started -- a lead segment holds its run alone -- and kept up to date
        here, in place). The increments are then queued under ``fence`` (see
        :meth:`queue_write`) and the total needs no read."""
        counts = {
            str(k): v for k, v in (usage or {}).items() if isinstance(v, int) and not isinstance(v, bool)
        }
        nonzero = {k: v for k, v in counts.items() if v}
        if not nonzero and not total:
            return {}
        key = self.usage_key(run_id)
        commands: list[tuple[Any, ...]] = [("hincrby", key, name, value) for name, value in nonzero.items()]
        if nonzero:
            commands.append(("expire", key, RUN_KEY_TTL_SECONDS))
        if known is not None:
            if commands:
                self.queue_write(commands, fence=fence)
            for name, value in nonzero.items():
                known[name] = known.get(name, 0) + value
            return {**{name: 0 for name in counts}, **known} if total else {}
        if total:
            commands.append(("hgetall", key))
        out = await self.write(commands)
        if not total:
            return {}
        summed = {name: 0 for name in counts}
        summed.update({_text(k): int(v) for k, v in (out[-1] or {}).items()})
        return summed


@dataclass
class _Events:
    """One run stream's events of a batch (see ``WorkerContext._write_batch``)."""

    record_key: str
    events_key: str
    payloads: list[str]


@dataclass
class _Write:
    """Commands written with a batch of run events (see ``WorkerContext.queue_write``/``write``)."""

    commands: list[tuple[Any, ...]]
    future: asyncio.Future[list[Any]] | None
    scripts: tuple[str, ...] = ()
    fence: str | None = None
    on_error: Callable[[BaseException], BaseException] | None = None


_SOURCES: dict[str, str] = {}
"""Script sources by SHA1 (filled from the ``scripts`` of queued writes)."""


def _script_source(sha: Any, scripts: tuple[str, ...] | None) -> str | None:
    """The source of the script ``sha`` among ``scripts`` (a write's script
    sources), or ``None`` when it is not there."""
    source = _SOURCES.get(sha)
    if source is None and scripts:
        for candidate in scripts:
            digest = hashlib.sha1(candidate.encode("utf-8")).hexdigest()
            _SOURCES[digest] = candidate
        source = _SOURCES.get(sha)
    return source


async def _round_trip(client: Any, conn: Any, stack: list[tuple[Any, Any]]) -> list[Any]:
    """Send a pipeline's commands (``(args, parse options)``, as in
    ``pipe.command_stack``) on ``conn`` in one write and read their replies,
    parsed as redis-py's pipeline does (error replies in place), within
    :data:`WRITE_TIMEOUT_SECONDS`: what ``Pipeline.execute(raise_on_error=False)``
    does for these commands (no retries: the client has none), without its
    per-call bookkeeping. A connection that failed or was interrupted is
    dropped (its state is unknown; the next send reconnects), as redis-py does."""
    try:
        async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
            encoder = conn.encoder
            utf8 = encoder.encoding in ("utf-8", "utf8") and encoder.encoding_errors == "strict"
            await conn.send_packed_command(_pack(encoder.encode, [args for args, _ in stack], utf8=utf8))
            replies: list[Any] = []
            for args, options in stack:
                try:
                    replies.append(await client.parse_response(conn, args[0], **options))
                except ResponseError as exc:
                    replies.append(exc)
            return replies
    except BaseException as exc:
        await conn.disconnect(nowait=True)
        if isinstance(exc, TimeoutError) and not isinstance(exc, RedisTimeoutError):
            raise RedisTimeoutError(f"a run write got no reply within {WRITE_TIMEOUT_SECONDS} s") from None
        raise


def _pack(encode: Callable[[Any], Any], commands: list[tuple[Any, ...]], *, utf8: bool = True) -> list[bytes]:
    """The RESP bytes of ``commands`` as one buffer: what redis-py's
    ``Connection.pack_commands`` sends (same command-name splitting, ``encode``
    -- the connection's encoder -- for every argument but ``bytes`` and, when
    it encodes strings as strict UTF-8 (``utf8``), ``str``), assembled with one
    join instead of a join per argument."""
    parts: list[Any] = []
    add = parts.append
    for args in commands:
        name = args[0]
        head = name.encode().split() if isinstance(name, str) else name.split()
        add(b"*%d\r\n" % (len(head) + len(args) - 1))
        for word in head:
            add(b"$%d\r\n%b\r\n" % (len(word), word))
        for arg in args[1:]:
            kind = type(arg)
            if kind is str and utf8:
                arg = arg.encode()
            elif kind is not bytes:
                arg = encode(arg)
            add(b"$%d\r\n" % len(arg))
            add(arg)
            add(b"\r\n")
    return [b"".join(parts)]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _wake_up(future: Any) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _model_json(event: Any) -> str | None:
    """The JSON of a pydantic event model (``""`` for a token-level stream
    event, which is not stored), or ``None`` for anything else."""
    if isinstance(event, dict):
        return None
    dump_json = getattr(event, "model_dump_json", None)
    if not callable(dump_json):
        return None
    kind = getattr(event, "type", None)
    if kind == "stream_event":
        return ""
    if kind == "agent_message":
        message = getattr(event, "message", None)
        if isinstance(message, dict) and _is_stream_delta(message):
            return ""
    try:
        return str(dump_json())
    except Exception:  # left to the dict path (and its default=str)
        return None


def _is_stream_delta(data: dict[str, Any]) -> bool:
    while data.get("type") == "agent_message" and isinstance(data.get("message"), dict):
        data = data["message"]
    return data.get("type") == "stream_event"


def _event_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return {"type": "unknown", "value": repr(event)}


__all__ = ["EVENT_LINGER_SECONDS", "RUN_KEY_TTL_SECONDS", "TaskSender", "WorkerContext", "default_worker_id"]
