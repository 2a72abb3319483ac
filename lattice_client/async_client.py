"""The asyncio client: :class:`AsyncLatticeClient` and its :class:`AsyncRunHandle`.

Submit runs (:mod:`lattice_client.submit`), wait for and stream their results,
cancel them, and look at the deployment (:mod:`lattice_client.views`) and the
tool calls waiting for a person (:mod:`lattice_client.decisions`). The blocking
client over it is :class:`lattice_client.client.LatticeClient`; both are
imported from :mod:`lattice_client` (or :mod:`lattice_client.client`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from typing import Any

from celery import Celery
from pydantic import BaseModel, Field
from redis.exceptions import ConnectionError as RedisConnectionError

from lattice_mailbox import MessageStatus, mailbox_from_url, mask_url
from lattice_mailbox.connections import read_again

from .budgets import BudgetsMixin, parse_budget
from .caller_trace import with_caller_trace
from .celery_config import make_celery_app
from .decisions import DecisionsMixin
from .errors import RunNotFoundError
from .models import RunRecord, RunResult, RunStatus
from .runstore import RunStore, check_run_id
from .settings import LatticeSettings, get_settings
from .submit import SubmitMixin
from .views import ViewsMixin

_EVENT_BATCH = 200
# Below redis-py's default socket timeout (5 s): a longer XREAD BLOCK fails with
# redis.exceptions.TimeoutError on a quiet stream instead of returning empty.
_MAX_BLOCK_MS = 4_000


def wait_timeout(timeout: float | None) -> float | None:
    """A wait's ``timeout`` (seconds) checked: ``None`` or ``math.inf`` = no
    limit (``None``); ``ValueError`` for a negative value, NaN or a non-number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


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


class AsyncLatticeClient(SubmitMixin, ViewsMixin, DecisionsMixin, BudgetsMixin):
    """Submit runs to a team of Celery workers and follow them (asyncio).

    Tool calls that wait for a person: :meth:`parked`, :meth:`resolve`,
    :meth:`approvals`, :meth:`approve`, :meth:`deny` (:mod:`lattice_client.decisions`).
    Token budgets: ``submit(..., budget=)`` and :meth:`raise_budget` (:mod:`lattice_client.budgets`).
    Team resolution and the submit path: :mod:`lattice_client.submit`;
    :meth:`status`, :meth:`inbox` and the other views: :mod:`lattice_client.views`.

    Arguments override the settings (``LATTICE_*`` environment variables, see
    :class:`~lattice_client.settings.LatticeSettings`): ``broker_url`` (Redis or
    RabbitMQ), ``mailbox_url`` (default: the broker URL; required with RabbitMQ),
    ``key_prefix``. Raises
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
            self.settings.state_url, prefix=self.settings.key_prefix, max_events=self.settings.max_run_events
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

    async def submit(
        self,
        team: str,
        prompt: str,
        *,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        require_registered: bool = True,
        trace_parent: dict[str, str] | str | None = None,
        budget: dict[str, int] | None = None,
    ) -> AsyncRunHandle:
        """Create a run of ``team`` on ``prompt`` and send ``lattice.run_lead``
        to the queue ``<prefix>.<team>.lead``.

        ``team``: the name or the ``"package.module:attribute"`` reference of a
        team a live worker serves (see :meth:`resolve_team`; nothing is
        imported here). ``require_registered=False`` also accepts a plain name
        no live worker serves -- for services that submit before their workers
        start: a warning is logged and the run waits in Redis until a worker
        consumes the team's lead queue (a misspelt name waits forever).
        ``run_id``: your own id (1-128 characters of ``[A-Za-z0-9_.:-]``, not
        starting with ``child.``, the runtime's own namespace; default a fresh
        ``run_<hex>``). ``metadata``: a JSON-serialisable dict kept on the run record.
        ``trace_parent``: the caller's trace context -- a W3C ``traceparent``
        string or a dict of propagation headers; default the active
        OpenTelemetry span, if any -- so the run's trace root is a child of the
        caller's span (kept as ``metadata["lattice_caller"]``, see
        :mod:`lattice_client.caller_trace`). ``budget``: ``{"tokens": N}``, the
        run's token budget (input, prompt-cache and output tokens of all its
        model calls, lead and members); the run parks as ``budget_reached`` when it is spent
        (:meth:`raise_budget`). Default: the team's own default budget, if any.

        Raises ``ValueError`` for bad input (unknown or unserved team, malformed
        team name or reference, empty prompt or one that is not valid Unicode
        text, prompt or metadata JSON over ``settings.max_message_bytes``
        bytes, duplicate, malformed or reserved run id, metadata not a JSON
        object, malformed ``trace_parent``, a ``budget`` other than
        ``{"tokens": positive int}``) with nothing written and no task sent. When the task cannot be
        sent (broker down), the run is finished as ``failed`` with the error
        and the error is raised.
        """
        budget_tokens = parse_budget(budget)
        metadata = with_caller_trace(metadata, trace_parent)
        run_id, queue = await self._create_run(
            team,
            prompt,
            run_id=run_id,
            metadata=metadata,
            require_registered=require_registered,
            budget_tokens=budget_tokens,
        )
        try:
            await asyncio.to_thread(self._send_run_lead, run_id, queue)
        except Exception as exc:
            await self._send_failed(run_id, queue, exc)
            raise
        return AsyncRunHandle(self, run_id)

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
        timeout = wait_timeout(timeout)
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
        timeout = wait_timeout(timeout)
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
        before = await read_again(lambda: self.runs.get(run_id))
        items = await self.runs.cancel(run_id)
        report = CancelReport(
            run_id=run_id,
            status=RunStatus.CANCELLED,
            previous_status=before.status if before is not None else None,
        )
        for item in items:
            message_id = str(item.get("message_id"))
            outcome = await self._cancel_message(message_id)
            if outcome is None:
                report.cancelled_messages.append(message_id)
            else:
                report.skipped_messages[message_id] = outcome
        record = await read_again(lambda: self.runs.get(run_id))
        if record is not None:
            report.status = record.status
        if record is not None and record.status == RunStatus.CANCELLED:
            for message_id in await read_again(lambda: self._unread_messages(run_id)):
                if await self._cancel_message(message_id) is None:
                    report.cancelled_messages.append(message_id)
        return report

    async def _cancel_message(self, message_id: str, attempts: int = 3) -> str | None:
        """Move one unfinished message to ``cancelled``; ``None`` when it was
        moved, else why not. A move whose connection was lost is decided by
        reading the message again (moved: done; still unfinished: moved again,
        up to ``attempts`` times)."""
        mailbox = self.mailbox
        for attempt in range(1, attempts + 1):
            message = await read_again(lambda: mailbox.get(message_id))
            if message is None:
                return "unknown message"
            if message.status == MessageStatus.CANCELLED and attempt > 1:
                return None  # the lost call moved it
            if message.status.terminal:
                return f"already {message.status.value}"
            try:
                changed = await mailbox.update_status(message_id, MessageStatus.CANCELLED)
            except ValueError as exc:  # InvalidTransitionError: it finished meanwhile
                return str(exc)
            except RedisConnectionError:
                if attempt == attempts:
                    raise
                continue
            return None if changed else "unknown message"
        return None  # (not reached)

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


__all__ = ["AsyncLatticeClient", "AsyncRunHandle", "CancelReport"]
