"""The thin client: submit team runs to the workers, wait for and stream their results.

Design: DESIGN.md section 5 ("Submit", "Resume") and section 9 (pinned names);
issue 6 item 5. A backend service installs only this package's thin parts: the
client never imports ``lattice_worker``, nor a team's module -- names and
references are resolved through the live workers' registry
(:mod:`lattice_client.registry`, see :meth:`AsyncLatticeClient.resolve_team`).

* :class:`AsyncLatticeClient` - the asyncio API.
* :class:`LatticeClient` - the same API, blocking; it runs the async client on a
  private event loop in a background thread, so it also works where a loop is
  already running (Jupyter, async web frameworks). Its hot calls (``submit`` of
  a team it resolved before, ``wait``) do their I/O from the calling thread with
  a blocking Redis client instead: no hop to the loop thread and back.

Where things live: run records, their event streams and the team registry in
the broker's Redis (``settings.broker_url``); mailboxes at
``settings.mailbox_url``; every key starts with ``settings.key_prefix``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from celery import Celery
from pydantic import BaseModel, Field
from redis import Redis as SyncRedis

from lattice_mailbox import MessageStatus, TeamMessage, mailbox_from_url, mask_url
from lattice_mailbox.connections import read_again_blocking, sync_redis

from .celery_config import RUN_LEAD_TASK, make_celery_app, queue_name
from .decisions import DecisionsMixin, ParkedCall, PendingApproval, SyncDecisionsMixin
from .errors import RunNotFoundError
from .models import RunRecord, RunResult, RunStatus
from .registry import (
    LiveRegistry,
    WorkerInfo,
    check_submitted_run_id,
    check_team_name,
    check_team_ref,
    read_workers,
)
from .runstore import RunStore, check_run_id, dumps, final_from_reply, result_from_reply
from .settings import LatticeSettings, get_settings

T = TypeVar("T")

logger = logging.getLogger(__name__)

_EVENT_BATCH = 200
# Below redis-py's default socket timeout (5 s): a longer XREAD BLOCK fails with
# redis.exceptions.TimeoutError on a quiet stream instead of returning empty.
_MAX_BLOCK_MS = 4_000
# Retries of the run_lead send when the broker connection fails.
_SEND_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}
# How long resolve_team keeps a live worker's answer (seconds), and for how many teams.
_TEAM_CACHE_SECONDS = 5.0
_TEAM_CACHE_SIZE = 1_000


def _block_ms(deadline: float | None, now: float, run_id: str, timeout: float | None) -> int:
    """How long the next blocking read may wait (milliseconds): at most
    ``_MAX_BLOCK_MS``, never past ``deadline`` (seconds on the caller's clock;
    ``None`` = no limit). Raises ``TimeoutError`` once the deadline has passed."""
    if deadline is None:
        return _MAX_BLOCK_MS
    remaining_ms = int((deadline - now) * 1000)
    if remaining_ms <= 0:
        raise TimeoutError(f"run {run_id!r} did not finish within {timeout} s")
    return min(remaining_ms, _MAX_BLOCK_MS)


class CancelReport(BaseModel):
    """What :meth:`AsyncLatticeClient.cancel` did.

    ``status``: the run's status afterwards (``cancelled``, or ``completed`` /
    ``failed`` when it had already finished). ``previous_status``: its status
    before this call (``cancelled`` for a run cancelled before: this call
    changed nothing but stragglers). ``cancelled_messages``: ids of the
    mailbox messages moved to ``cancelled``; ``skipped_messages``: ids of
    unfinished items whose message could not be cancelled (already finished,
    or unknown), each with the reason.
    """

    run_id: str
    status: RunStatus
    previous_status: RunStatus | None = None
    cancelled_messages: list[str] = Field(default_factory=list)
    skipped_messages: dict[str, str] = Field(default_factory=dict)


class StatusReport(BaseModel):
    """Mailbox counts and recent runs, as :meth:`AsyncLatticeClient.status` returns them.

    ``mailboxes``: mailbox id -> {status value -> number of messages};
    ``runs``: the most recent runs, newest first; ``workers``: the live
    workers (of ``team`` when given), see :class:`~lattice_client.registry.WorkerInfo`;
    ``parked`` / ``approvals``: the tool calls waiting for a person (oldest first).
    """

    team: str | None = None
    mailboxes: dict[str, dict[str, int]] = Field(default_factory=dict)
    runs: list[RunRecord] = Field(default_factory=list)
    workers: list[WorkerInfo] = Field(default_factory=list)
    parked: list[ParkedCall] = Field(default_factory=list)
    approvals: list[PendingApproval] = Field(default_factory=list)


def _resolve_settings(
    settings: LatticeSettings | None, broker_url: str | None, mailbox_url: str | None, key_prefix: str | None
) -> LatticeSettings:
    overrides = {"broker_url": broker_url, "mailbox_url": mailbox_url, "key_prefix": key_prefix}
    if settings is None:
        return get_settings(**overrides)
    return settings.with_overrides(**overrides)


class AsyncRunHandle:
    """A submitted run (asyncio). ``run_id`` names it; :meth:`wait` and
    :meth:`events` read its Redis event stream."""

    def __init__(self, client: AsyncLatticeClient, run_id: str) -> None:
        self._client = client
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"AsyncRunHandle(run_id={self.run_id!r})"

    async def wait(self, timeout: float | None = None) -> RunResult:  # noqa: ASYNC109 (pinned API)
        """The run's final :class:`RunResult`; see :meth:`AsyncLatticeClient.wait`."""
        return await self._client.wait(self.run_id, timeout=timeout)

    def events(self, timeout: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """The run's events; see :meth:`AsyncLatticeClient.events`."""
        return self._client.events(self.run_id, timeout=timeout)

    async def get(self) -> RunRecord | None:
        """The run record (status, result, ...), or ``None`` if it is gone."""
        return await self._client.get_run(self.run_id)

    async def cancel(self) -> CancelReport:
        """Cancel this run; see :meth:`AsyncLatticeClient.cancel`."""
        return await self._client.cancel(self.run_id)


class AsyncLatticeClient(DecisionsMixin):
    """Submit runs to a team of Celery workers and follow them (asyncio).

    Tool calls that wait for a person: :meth:`parked`, :meth:`resolve`,
    :meth:`approvals`, :meth:`approve`, :meth:`deny` (:mod:`lattice_client.decisions`).

    Arguments override the settings (``LATTICE_*`` environment variables, see
    :class:`~lattice_client.settings.LatticeSettings`): ``broker_url`` (Redis),
    ``mailbox_url`` (default: the broker URL), ``key_prefix``. Raises
    ``pydantic.ValidationError`` (a ``ValueError``) on bad settings. Nothing
    connects until the first call. Use ``async with`` or :meth:`aclose`.
    """

    def __init__(
        self,
        broker_url: str | None = None,
        mailbox_url: str | None = None,
        *,
        key_prefix: str | None = None,
        settings: LatticeSettings | None = None,
    ) -> None:
        self.settings = _resolve_settings(settings, broker_url, mailbox_url, key_prefix)
        self.runs = RunStore(
            self.settings.broker_url, prefix=self.settings.key_prefix, max_events=self.settings.max_run_events
        )
        self._mailbox: Any = None
        self._celery: Celery | None = None
        self._lock = threading.Lock()
        # resolve_team's registered answers: team -> (name, ref, time.monotonic() it expires at)
        self._teams: dict[str, tuple[str, str | None, float]] = {}

    def __repr__(self) -> str:
        return (
            f"AsyncLatticeClient(broker_url={mask_url(self.settings.broker_url)!r}, "
            f"key_prefix={self.settings.key_prefix!r})"
        )

    async def __aenter__(self) -> AsyncLatticeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- parts ------------------------------------------------------------------------------------

    @property
    def mailbox(self) -> Any:
        """The mailbox store, built on first use: ``mailbox_from_url(settings.mailbox_url,
        prefix=settings.key_prefix, max_message_bytes=settings.max_message_bytes)`` (on
        SQL stores the key prefix selects the tables, see
        :func:`lattice_mailbox.sql_table_prefix`)."""
        with self._lock:
            if self._mailbox is None:
                self._mailbox = mailbox_from_url(
                    self.settings.mailbox_url,
                    prefix=self.settings.key_prefix,
                    max_message_bytes=self.settings.max_message_bytes,
                )
            return self._mailbox

    @property
    def celery(self) -> Celery:
        """The Celery app used to send tasks by name (no task bodies: no worker import)."""
        with self._lock:
            if self._celery is None:
                self._celery = make_celery_app(self.settings)
            return self._celery

    # -- submit -----------------------------------------------------------------------------------

    async def live_workers(self) -> list[WorkerInfo]:
        """The live workers of this key prefix (their heartbeat has not expired),
        with the teams and queues each serves; ``[]`` when none is running.
        See :mod:`lattice_client.registry`."""
        return await read_workers(await self.runs.redis(), self.settings.key_prefix)

    async def registered_teams(self) -> dict[str, str]:
        """``{team reference or name -> team name}`` as the live workers published
        them (``{}`` when no worker of this key prefix is running)."""
        return LiveRegistry(await self.live_workers()).mapping()

    async def resolve_team(self, team: str, *, require_registered: bool = True) -> tuple[str, str | None]:
        """``(team name, team ref or None)`` for a team name or a
        ``"package.module:attribute"`` reference, through the live registry:
        what the running workers published (:mod:`lattice_client.registry`).
        The client never imports a team's module.

        A live worker's answer is reused for a while (5 s), so most submits make
        no registry round trip. A name or reference no live worker serves is
        refused: its run would wait on a queue nobody consumes. With
        ``require_registered=False`` a plain *name* is accepted anyway (for
        services that submit before their workers start, or while they
        restart): a warning is logged (logger ``lattice_client.client``) and
        the run waits in Redis until a worker for that name consumes its queue.
        A reference is never accepted unresolved: only a worker started with it
        knows its team's name (submit by name instead).

        Raises ``ValueError`` (nothing is written) for a malformed name (not
        1-64 characters of ``[A-Za-z0-9_.-]``) or reference, a reference no
        live worker serves, or a name no live worker serves (with
        ``require_registered=True``).
        """
        if not isinstance(team, str) or not team.strip():
            raise ValueError("team must be a non-empty team name or a 'package.module:attribute' reference")
        is_ref = ":" in team
        if is_ref:
            check_team_ref(team)
        else:
            check_team_name(team)
        cached = self._cached_team(team)
        if cached is not None:
            return cached
        live = LiveRegistry(await self.live_workers())
        name = live.resolve(team)
        if name is not None:
            # A live worker's answer is kept a little while: no registry round trip before
            # each submit. Other answers are not kept.
            answer = name, team if is_ref else None
            if len(self._teams) >= _TEAM_CACHE_SIZE:
                self._teams.clear()
            self._teams[team] = (*answer, time.monotonic() + _TEAM_CACHE_SECONDS)
            return answer
        if is_ref or require_registered:
            raise ValueError(_unserved_message(team, self.settings.key_prefix, live, is_ref=is_ref))
        logger.warning(
            "no live worker serves team %r under key prefix %r; the run is queued and waits until a worker "
            "for it starts (lattice worker package.module:attribute)",
            team,
            self.settings.key_prefix,
        )
        return team, None

    def _cached_team(self, team: str) -> tuple[str, str | None] | None:
        cached = self._teams.get(team)
        if cached is not None and cached[2] > time.monotonic():
            return cached[0], cached[1]
        return None

    async def submit(
        self,
        team: str,
        prompt: str,
        *,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        require_registered: bool = True,
    ) -> AsyncRunHandle:
        """Create a run of ``team`` on ``prompt`` and send ``lattice.run_lead``
        to the queue ``<prefix>.<team>.lead``.

        ``team``: the name or the ``"package.module:attribute"`` reference of a
        team a live worker serves (see :meth:`resolve_team`; nothing is
        imported here). ``require_registered=False`` also accepts a plain name
        no live worker serves -- for services that submit before their workers
        start: a warning is logged and the run waits in Redis until a worker
        for that name consumes its queue (a misspelt name waits forever).
        ``run_id``: your own id (1-128 characters of ``[A-Za-z0-9_.:-]``, not
        starting with ``child.``, the runtime's own namespace; default a fresh
        ``run_<hex>``). ``metadata``: a JSON-serialisable dict kept on the run record.

        Raises ``ValueError`` for bad input (unknown or unserved team, malformed
        team name or reference, empty prompt, prompt over
        ``settings.max_message_bytes`` bytes, duplicate, malformed or reserved
        run id, metadata not a JSON object) with nothing written and no task
        sent. When the task cannot be sent (broker down), the run is finished
        as ``failed`` with the error and the error is raised.
        """
        run_id, queue = await self._create_run(
            team, prompt, run_id=run_id, metadata=metadata, require_registered=require_registered
        )
        try:
            await asyncio.to_thread(self._send_run_lead, run_id, queue)
        except Exception as exc:
            await self._send_failed(run_id, queue, exc)
            raise
        return AsyncRunHandle(self, run_id)

    async def _create_run(
        self,
        team: str,
        prompt: str,
        *,
        run_id: str | None,
        metadata: dict[str, Any] | None,
        require_registered: bool,
    ) -> tuple[str, str]:
        # submit's checks and the run record: (run id, the lead queue to send run_lead to)
        run_id = self._check_submit(prompt, run_id, metadata)
        name, ref = await self.resolve_team(team, require_registered=require_registered)
        await self.runs.create(run_id, name, prompt, team_ref=ref, metadata=metadata)
        return run_id, queue_name(self.settings.key_prefix, name, "lead")

    def _check_submit(self, prompt: str, run_id: str | None, metadata: dict[str, Any] | None) -> str:
        # submit's checks of its input (ValueError); returns the run id to use
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        size = len(prompt.encode("utf-8"))
        if size > self.settings.max_message_bytes:
            raise ValueError(
                f"prompt is {size} bytes, over the bound of {self.settings.max_message_bytes} bytes "
                "(LATTICE_MAX_MESSAGE_BYTES)"
            )
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}")
            dumps(metadata, "metadata")
        return check_submitted_run_id(run_id) if run_id is not None else f"run_{uuid.uuid4().hex}"

    async def _send_failed(self, run_id: str, queue: str, exc: Exception) -> None:
        # the run_lead task could not be sent: the run fails with the error
        error = f"could not enqueue {RUN_LEAD_TASK} on {queue}: {exc}"
        try:
            await self.runs.finish(run_id, RunResult(run_id=run_id, status="failed", error=error))
        except Exception:  # the run store may be down too; the original error matters more
            pass

    def _send_run_lead(self, run_id: str, queue: str) -> None:
        # Blocking (a thread of its own or the blocking client's caller). The task
        # message (LPUSH) and its task-sent event (PUBLISH) go in one pipeline
        # through a kombu publish batch (kombu >= 5.7) instead of two round trips.
        # A batch is sent once, without kombu's retries: when it fails the message
        # is sent again the plain way, retried as _SEND_RETRY says. (Should the
        # failed batch have been delivered after all, run_lead is there twice:
        # only one of them starts the queued run, the other finds it started.)
        celery = self.celery
        options: dict[str, Any] = {
            "args": [run_id],
            "queue": queue,
            "task_id": f"{run_id}.run_lead",
            "retry": True,
            "retry_policy": _SEND_RETRY,
        }
        try:
            with celery.producer_or_acquire() as producer:
                batch = getattr(producer, "batch", None)
                if batch is not None:
                    with batch():
                        celery.send_task(RUN_LEAD_TASK, producer=producer, **options)
                    return
        except Exception:
            logger.warning(
                "run %s: batched send of %s failed; sending again", run_id, RUN_LEAD_TASK, exc_info=True
            )
        celery.send_task(RUN_LEAD_TASK, **options)

    def handle(self, run_id: str) -> AsyncRunHandle:
        """A handle for an existing run id (no I/O; raises ``ValueError`` on a malformed id)."""
        return AsyncRunHandle(self, check_run_id(run_id))

    # -- follow -----------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run record, or ``None`` when there is no such run."""
        return await self.runs.get(run_id)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:  # noqa: ASYNC109 (pinned API)
        """Block until the run's ``run_result`` event and return the :class:`RunResult`.

        ``timeout`` in **seconds** (``None`` = no limit). Reads the run record,
        then blocks (``XREAD``, no polling loop) on the run's result stream,
        which only its ``run_result`` event enters (the other events do not wake
        this call). Raises the builtin ``TimeoutError`` when the timeout passes
        and :class:`RunNotFoundError` for an unknown run (also when the run is
        deleted while waiting).
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        runs = self.runs
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        exists, result = await runs.final_result(run_id)
        while True:
            if not exists:
                raise RunNotFoundError(run_id)
            if result is not None:
                return result
            block_ms = _block_ms(deadline, loop.time(), run_id, timeout)
            result = await runs.read_result(run_id, block_ms=block_ms)
            if result is None:
                # Quiet for block_ms: look at the record again (the run may be gone, or
                # finished by a writer that knows no result stream: an older worker).
                exists, result = await runs.final_result(run_id)

    async def events(
        self,
        run_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (pinned API)
        *,
        _results_only: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """The run's events from its first one, as dicts with a ``type``, ending
        after the ``{"type": "run_result", ...}`` event.

        ``timeout`` in **seconds** for the whole iteration (``None`` = no limit):
        the builtin ``TimeoutError`` is raised when it passes first. Raises
        :class:`RunNotFoundError` for an unknown run (checked before the first event).
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        record = await self.runs.get(run_id)
        if record is None:
            raise RunNotFoundError(run_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        last_id = "0-0"
        first = True
        while True:
            block_ms: int | None = None  # the first read never blocks
            if not first:
                block_ms = _block_ms(deadline, loop.time(), run_id, timeout)
            batch = await self.runs.events(run_id, last_id, block_ms=block_ms, count=_EVENT_BATCH)
            if first and not batch and record.result is not None:
                # finished, but its stream is gone (trimmed or deleted): the record has the result
                yield record.result.to_event()
                return
            first = False
            for entry_id, event in batch:
                last_id = entry_id
                if event.get("type") == "run_result":
                    yield event
                    return
                if not _results_only:
                    yield event

    # -- control ----------------------------------------------------------------------------------

    async def cancel(self, run_id: str) -> CancelReport:
        """Cancel a run, even with no worker online.

        Marks the run ``cancelled`` (unless it already completed or failed),
        appends its ``run_result`` event, and moves the mailbox message of every
        unfinished work item to ``cancelled``, so no worker runs it later --
        including tasks a lead turn in progress had sent but not registered yet
        (its call journal). Replies and failure reports already sent to the
        lead for this run, which its lead will now never read, are moved from
        ``pending`` to ``cancelled`` too (so ``status`` shows nothing pending).
        Idempotent (``previous_status`` tells whether the run was cancelled
        already). Raises :class:`RunNotFoundError` for an unknown run.
        """
        before = await self.runs.get(run_id)
        items = await self.runs.cancel(run_id)
        report = CancelReport(
            run_id=run_id,
            status=RunStatus.CANCELLED,
            previous_status=before.status if before is not None else None,
        )
        mailbox = self.mailbox
        for item in items:
            message_id = str(item.get("message_id"))
            message = await mailbox.get(message_id)
            if message is None:
                report.skipped_messages[message_id] = "unknown message"
                continue
            if message.status.terminal:
                report.skipped_messages[message_id] = f"already {message.status.value}"
                continue
            try:
                changed = await mailbox.update_status(message_id, MessageStatus.CANCELLED)
            except ValueError as exc:  # InvalidTransitionError: it finished meanwhile
                report.skipped_messages[message_id] = str(exc)
                continue
            if changed:
                report.cancelled_messages.append(message_id)
            else:
                report.skipped_messages[message_id] = "unknown message"
        record = await self.runs.get(run_id)
        if record is not None:
            report.status = record.status
        if record is not None and record.status == RunStatus.CANCELLED:
            for message_id in await self._unread_messages(run_id):
                try:
                    message = await mailbox.get(message_id)
                    if message is None or message.status.terminal:
                        continue
                    if await mailbox.update_status(message_id, MessageStatus.CANCELLED):
                        report.cancelled_messages.append(message_id)
                except ValueError:  # finished meanwhile
                    continue
        return report

    async def _unread_messages(self, run_id: str) -> list[str]:
        # replies to the lead of finished items not consumed yet, then the task
        # messages of a lead batch in progress (journaled, not registered)
        ids = await self.runs.unread_reports(run_id)
        for entry in (await self.runs.journal(run_id)).values():
            box, work_item_id = entry.get("mailbox_id"), entry.get("work_item_id")
            if box and work_item_id:
                ids += [
                    m.id for m in await self.mailbox.inbox(str(box), "all") if m.work_item_id == work_item_id
                ]
        return ids

    async def status(self, team: str | None = None, *, limit: int = 20) -> StatusReport:
        """Per-status message counts of every ``<team>::*`` mailbox (every mailbox
        when ``team`` is ``None``), the ``limit`` most recent runs, the live
        workers (those serving ``team`` when given) and the tool calls waiting
        for a person. ``team`` may also be a ``"package.module:attribute"``
        reference a live worker serves (see
        :meth:`resolve_team`)."""
        workers = await self.live_workers()
        if team and ":" in team and "::" not in team:
            live = LiveRegistry(workers)
            name = live.resolve(check_team_ref(team))
            if name is None:
                raise ValueError(_unserved_message(team, self.settings.key_prefix, live, is_ref=True))
            team = name
        prefix = f"{team}::" if team else None
        mailbox = self.mailbox
        ids = await mailbox.mailbox_ids(prefix)
        counts = {mailbox_id: await mailbox.counts(mailbox_id) for mailbox_id in ids}
        runs = await self.runs.list_runs(team, limit=limit)
        if team:
            workers = [w for w in workers if team in w.team_names()]
        parked, approvals = await self.parked(team), await self.approvals(team)
        return StatusReport(
            team=team, mailboxes=counts, runs=runs, workers=workers, parked=parked, approvals=approvals
        )

    async def known_mailboxes(self, team: str | None = None) -> list[str]:
        """Ids of the mailboxes that ever received a message (of ``team``'s
        mailboxes only, when given), sorted."""
        return list(await self.mailbox.mailbox_ids(f"{team}::" if team else None))

    async def known_teams(self) -> list[str]:
        """Team names this deployment knows, sorted: those a worker registered
        and those with mailboxes."""
        names = set((await self.registered_teams()).values())
        names |= {box.partition("::")[0] for box in await self.known_mailboxes()}
        return sorted(names)

    async def team_exists(self, team: str) -> bool:
        """Whether ``team`` (a name) is registered, has mailboxes or has runs."""
        if team in (await self.registered_teams()).values():
            return True
        if await self.known_mailboxes(team):
            return True
        return bool(await self.runs.list_runs(team, limit=1))

    async def inbox(self, mailbox_id: str, status: MessageStatus | str = "pending") -> list[TeamMessage]:
        """Messages of one mailbox (``"<team>::<member>"``) with ``status`` (a
        :class:`MessageStatus` value or ``"all"``), oldest first. Raises
        ``ValueError`` for an unknown status."""
        if status != "all":
            status = MessageStatus.parse(status)
        return await self.mailbox.inbox(mailbox_id, status)

    async def aclose(self) -> None:
        """Close this loop's connections (Redis clients, the Celery producer pool)."""
        await self.runs.aclose()
        mailbox = self._mailbox
        if mailbox is not None and hasattr(mailbox, "aclose"):
            await mailbox.aclose()
        celery, self._celery = self._celery, None
        if celery is not None:
            await asyncio.to_thread(celery.close)

    close = aclose


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _unserved_message(team: str, prefix: str, live: LiveRegistry, *, is_ref: bool) -> str:
    names = live.team_names()
    served = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "none"
    workers = f"{len(live.workers)} live worker(s) serving: {served}" if live.workers else "no live worker"
    if is_ref:
        return (
            f"unknown team reference {team!r}: no live worker under key prefix {prefix!r} was started with it "
            f"({workers}). The client never imports a team's module: start a worker for it first "
            f"(lattice worker {team}), or submit by the team's name with require_registered=False "
            "(CLI: --allow-unregistered) to queue the run for workers that start later."
        )
    hint = f" A reference needs ':attribute', e.g. '{team}:team'." if "." in team else ""
    return (
        f"no live worker serves team {team!r} under key prefix {prefix!r} ({workers}).{hint} "
        "Check the name, start a worker for the team (lattice worker package.module:attribute), "
        "or submit with require_registered=False (CLI: --allow-unregistered) to queue it for workers "
        "that start later."
    )


# -- the blocking client -------------------------------------------------------------------------


class _LoopThread:
    """A private event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="lattice-client-loop", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def problem(self) -> str | None:
        """Why a blocking call cannot be made from this thread now, or ``None``."""
        if threading.current_thread() is self.thread:
            return "LatticeClient: blocking call from its own event loop thread"
        if self.loop.is_closed():
            return "LatticeClient is closed"
        return None

    def run(self, coro: Awaitable[T]) -> T:
        problem = self.problem()
        if problem is not None:
            close = getattr(coro, "close", None)
            if close is not None:
                close()  # never awaited: close it quietly
            raise RuntimeError(problem)
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


def _stop_loop(loop_thread: _LoopThread) -> None:
    loop_thread.stop()


class RunHandle:
    """A submitted run (blocking API). ``run_id`` names it."""

    def __init__(self, client: LatticeClient, run_id: str) -> None:
        self._client = client
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"RunHandle(run_id={self.run_id!r})"

    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run finishes and return its :class:`RunResult`.

        ``timeout`` in **seconds** (``None`` = no limit); raises the builtin
        ``TimeoutError`` when it passes, :class:`RunNotFoundError` for an unknown run.
        """
        return self._client.wait(self.run_id, timeout=timeout)

    def events(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Iterate the run's events (dicts with a ``type``), ending after the
        ``run_result`` event; ``timeout`` in seconds for the whole iteration
        (builtin ``TimeoutError``)."""
        return self._client.events(self.run_id, timeout=timeout)

    def get(self) -> RunRecord | None:
        """The run record, or ``None``."""
        return self._client.get_run(self.run_id)

    def cancel(self) -> CancelReport:
        """Cancel this run (see :meth:`LatticeClient.cancel`)."""
        return self._client.cancel(self.run_id)


class LatticeClient(SyncDecisionsMixin):
    """The blocking client: the :class:`AsyncLatticeClient` API without ``await``.

    Runs the async client on a private event loop in a background thread, so it
    works in plain scripts, threads, Jupyter and inside async frameworks alike
    (``wait`` and the usual ``submit`` read and write from the calling thread,
    with a blocking Redis client of its own).
    Arguments as for :class:`AsyncLatticeClient`. Call :meth:`close` (or use
    ``with``) when done.
    """

    def __init__(
        self,
        broker_url: str | None = None,
        mailbox_url: str | None = None,
        *,
        key_prefix: str | None = None,
        settings: LatticeSettings | None = None,
    ) -> None:
        self.aio = AsyncLatticeClient(broker_url, mailbox_url, key_prefix=key_prefix, settings=settings)
        self.settings = self.aio.settings
        self._loop = _LoopThread()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop)
        self._blocking: SyncRedis | None = None
        self._blocking_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"LatticeClient(broker_url={mask_url(self.settings.broker_url)!r}, "
            f"key_prefix={self.settings.key_prefix!r})"
        )

    def __enter__(self) -> LatticeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return self._loop.run(fn(*args, **kwargs))

    def submit(
        self,
        team: str,
        prompt: str,
        *,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        require_registered: bool = True,
    ) -> RunHandle:
        """Create a run and enqueue its lead task; see :meth:`AsyncLatticeClient.submit`
        (``require_registered=False`` accepts a team name no worker has registered yet)."""
        aio = self.aio
        problem = self._loop.problem()
        if problem is not None:
            raise RuntimeError(problem)
        resolved = aio._cached_team(team) if isinstance(team, str) else None
        if resolved is None:
            run_id, queue = self._call(
                aio._create_run,
                team,
                prompt,
                run_id=run_id,
                metadata=metadata,
                require_registered=require_registered,
            )
        else:
            # A team resolved before (the usual case): the checks and the create from
            # this thread (which blocks anyway) with the blocking Redis client.
            run_id = aio._check_submit(prompt, run_id, metadata)
            name, ref = resolved
            aio.runs.create_blocking(
                self._blocking_redis(), run_id, name, prompt, team_ref=ref, metadata=metadata
            )
            queue = queue_name(self.settings.key_prefix, name, "lead")
        # Sent from this thread too: no hop to the loop thread and on to a pool thread.
        try:
            aio._send_run_lead(run_id, queue)
        except Exception as exc:
            self._call(aio._send_failed, run_id, queue, exc)
            raise
        return RunHandle(self, run_id)

    def handle(self, run_id: str) -> RunHandle:
        """A handle for an existing run id (raises ``ValueError`` on a malformed id)."""
        return RunHandle(self, check_run_id(run_id))

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run record, or ``None``."""
        return self._call(self.aio.get_run, run_id)

    def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """See :meth:`RunHandle.wait`."""
        # AsyncLatticeClient.wait's reads, made from the calling thread (which blocks
        # anyway) with a blocking Redis client: the result wakes this thread
        # directly, not the loop thread first and this thread after it.
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        problem = self._loop.problem()
        if problem is not None:
            raise RuntimeError(problem)
        runs = self.aio.runs
        record, stream = runs.keys(run_id).record, runs.result_key(run_id)
        client = self._blocking_redis()
        deadline = None if timeout is None else time.monotonic() + timeout
        exists, result = final_from_reply(
            read_again_blocking(lambda: client.hmget(record, ["status", "result"]))
        )
        while True:
            if not exists:
                raise RunNotFoundError(run_id)
            if result is not None:
                return result
            block_ms = _block_ms(deadline, time.monotonic(), run_id, timeout)
            result = result_from_reply(
                read_again_blocking(lambda ms=block_ms: client.xread({stream: "0-0"}, count=1, block=ms))
            )
            if result is None:  # quiet for block_ms: look at the record again (see AsyncLatticeClient.wait)
                exists, result = final_from_reply(
                    read_again_blocking(lambda: client.hmget(record, ["status", "result"]))
                )

    def _blocking_redis(self) -> SyncRedis:
        # the blocking client of wait and submit (its connection pool is thread-safe)
        with self._blocking_lock:
            if self._blocking is None:
                self._blocking = sync_redis(self.settings.broker_url, decode_responses=True)
            return self._blocking

    def events(self, run_id: str, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """See :meth:`RunHandle.events`."""
        agen = self.aio.events(run_id, timeout=timeout)
        try:
            while True:
                try:
                    yield self._loop.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.loop.is_closed():
                self._loop.run(agen.aclose())

    def cancel(self, run_id: str) -> CancelReport:
        """See :meth:`AsyncLatticeClient.cancel`."""
        return self._call(self.aio.cancel, run_id)

    def status(self, team: str | None = None, *, limit: int = 20) -> StatusReport:
        """See :meth:`AsyncLatticeClient.status`."""
        return self._call(self.aio.status, team, limit=limit)

    def inbox(self, mailbox_id: str, status: MessageStatus | str = "pending") -> list[TeamMessage]:
        """See :meth:`AsyncLatticeClient.inbox`."""
        return self._call(self.aio.inbox, mailbox_id, status)

    def known_mailboxes(self, team: str | None = None) -> list[str]:
        """See :meth:`AsyncLatticeClient.known_mailboxes`."""
        return self._call(self.aio.known_mailboxes, team)

    def known_teams(self) -> list[str]:
        """See :meth:`AsyncLatticeClient.known_teams`."""
        return self._call(self.aio.known_teams)

    def team_exists(self, team: str) -> bool:
        """See :meth:`AsyncLatticeClient.team_exists`."""
        return self._call(self.aio.team_exists, team)

    def close(self) -> None:
        """Close the connections and stop the private event loop (idempotent)."""
        if not self._finalizer.alive:
            return
        try:
            if not self._loop.loop.is_closed():
                self._loop.run(self.aio.aclose())
        finally:
            self._finalizer()
            with self._blocking_lock:
                blocking, self._blocking = self._blocking, None
            if blocking is not None:
                blocking.close()


__all__ = [
    "AsyncLatticeClient",
    "AsyncRunHandle",
    "CancelReport",
    "LatticeClient",
    "RunHandle",
    "RunResult",
    "StatusReport",
]
