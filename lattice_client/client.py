"""The thin client: submit team runs to the workers, wait for and stream their results.

Design: docs/architecture.md, "Steps as Celery tasks" (steps 1 and 4) and "Public API".
A backend service installs only this package's thin parts: the
client never imports ``lattice_worker``, nor a team's module -- names and
references are resolved through the live workers' registry
(:mod:`lattice_client.registry`, see :meth:`AsyncLatticeClient.resolve_team`).

* :class:`AsyncLatticeClient` - the asyncio API.
* :class:`LatticeClient` - the same API, blocking; it runs the async client on a
  private event loop in a background thread, so it also works where a loop is
  already running (Jupyter, async web frameworks). Its hot calls (``submit`` of
  a team it resolved before, ``wait``) do their I/O from the calling thread with
  a blocking Redis client instead: no hop to the loop thread and back.

This module holds the blocking client (:class:`LatticeClient`, :class:`RunHandle`)
and re-exports the asyncio one from :mod:`lattice_client.async_client` (its
submit path in :mod:`lattice_client.submit`, its status and inbox views in
:mod:`lattice_client.views`), so ``lattice_client.client`` names the whole API.

Where things live: run records, their event streams and the live worker
registry in ``settings.state_url`` (the broker's Redis, or the mailbox Redis
with a RabbitMQ broker); mailboxes at ``settings.mailbox_url``; every key
starts with ``settings.key_prefix``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from redis import Redis as SyncRedis

from lattice_mailbox import MessageStatus, TeamMessage, mask_url
from lattice_mailbox.connections import read_again_blocking, sync_redis

from .async_client import AsyncLatticeClient, AsyncRunHandle, CancelReport, _block_ms, wait_timeout
from .budgets import SyncBudgetsMixin, parse_budget
from .caller_trace import with_caller_trace
from .celery_config import queue_name
from .decisions import SyncDecisionsMixin
from .errors import RunNotFoundError
from .models import RunRecord, RunResult
from .rate_limits import WaitingModelCalls
from .runstore import check_run_id, final_from_reply, result_from_reply
from .settings import LatticeSettings
from .views import StatusReport

T = TypeVar("T")

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


class LatticeClient(SyncDecisionsMixin, SyncBudgetsMixin):
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
        trace_parent: dict[str, str] | str | None = None,
        budget: dict[str, int] | None = None,
    ) -> RunHandle:
        """Create a run and enqueue its lead task; see :meth:`AsyncLatticeClient.submit`
        (``require_registered=False`` accepts a team name no worker has registered yet;
        ``trace_parent``: the caller's trace context, default the active OpenTelemetry span;
        ``budget``: ``{"tokens": N}``, the run's token budget)."""
        aio = self.aio
        budget_tokens = parse_budget(budget)
        metadata = with_caller_trace(metadata, trace_parent)
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
                budget_tokens=budget_tokens,
            )
        else:
            # A team resolved before (the usual case): the checks and the create from
            # this thread (which blocks anyway) with the blocking Redis client.
            run_id = aio._check_submit(prompt, run_id, metadata)
            name, ref = resolved
            aio.runs.create_blocking(
                self._blocking_redis(),
                run_id,
                name,
                prompt,
                team_ref=ref,
                metadata=metadata,
                budget_tokens=budget_tokens,
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
        timeout = wait_timeout(timeout)
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
                self._blocking = sync_redis(self.settings.state_url, decode_responses=True)
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

    def rate_limited(self) -> list[WaitingModelCalls]:
        """See :meth:`AsyncLatticeClient.rate_limited`."""
        return self._call(self.aio.rate_limited)

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
