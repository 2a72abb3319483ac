"""What the lead and member steps call to put their model calls under the shared limits.

* :func:`limited_client` -- the model client an agent of a step gets (its own
  wrapped in a :class:`~.gate.LimitedModelClient`; unchanged with no
  ``LATTICE_MODEL_LIMITS``);
* :func:`lead_scope` / :func:`item_scope` -- the :class:`~.gate.CallScope` a
  step's query runs under (``with`` blocks setting :data:`~.gate.current_scope`);
* :func:`lead_waits` -- a lead segment whose call waits for its turn ends: its
  history and events written (fenced by its lease), the run ``resuming``
  without a lease (``lua/lead_wait.lua``), ``resume_lead`` enqueued with a
  Celery countdown for the turn;
* :func:`waits_in_place` -- ``lattice drain``'s steps wait in place instead;
* :func:`item_waits` -- a member's attempt whose call waits ends: its history
  and journal written (fenced by its claim), the message released to
  ``pending`` (it keeps its FIFO place), its doorbell rung with a countdown.

Neither holds a pool slot, a lease or a claim while it waits; the call's
reservation is held in Redis (:func:`~.gate.hold_key`) so the next attempt
neither runs early nor loses its place. A step that cannot end (no lease, no
journal) sleeps instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources
from typing import Any

from lattice_client.errors import RunLeaseLostError
from lattice_client.runstore import now_ms

from ..run.context import WorkerContext
from ..run.replay import ReplayModelClient
from .bucket import RateLimiter, pipelined_time, with_time
from .gate import (
    SHORT_WAIT_SECONDS,
    CallScope,
    LimitedModelClient,
    TurnWait,
    current_scope,
    decode_hold,
    hold_key,
)

LEAD_WAIT_LUA = (
    resources.files("lattice_worker.runtime.limits").joinpath("lua/lead_wait.lua").read_text("utf-8")
)
"""End a lead segment that waits for its turn (see the script's header)."""
_LEAD_WAIT_SHA = hashlib.sha1(LEAD_WAIT_LUA.encode("utf-8")).hexdigest()  # noqa: S324 - Redis names scripts so


steps_may_end: ContextVar[bool] = ContextVar("lattice_steps_may_end", default=True)
"""Whether a step whose call waits may end and come back at its turn (False:
``lattice drain``, which does a member's work by hand with no worker to come
back to: its calls wait in place)."""


@contextmanager
def waits_in_place() -> Iterator[None]:
    """Within it, the steps' calls wait for their turn in place (see :data:`steps_may_end`)."""
    token = steps_may_end.set(False)
    try:
        yield
    finally:
        steps_may_end.reset(token)


def limiter_for(ctx: WorkerContext) -> RateLimiter | None:
    """The context's :class:`RateLimiter` (one per context), or ``None`` without limits."""
    limits = ctx.settings.model_limits
    if not limits:
        return None
    limiter = ctx.__dict__.get("_rate_limiter")
    if limiter is None:
        limiter = RateLimiter(ctx.redis, ctx.prefix, limits)
        ctx.__dict__["_rate_limiter"] = limiter
    return limiter


def limited_client(ctx: WorkerContext, options: Any) -> Any:
    """The model client for an agent with ``options`` in a step of ``ctx``: its
    ``model_client`` (``None``: the Anthropic client of its ``api_key`` /
    ``base_url``) under the shared limits, or ``options.model_client`` itself
    when ``ctx`` has none."""
    limiter = limiter_for(ctx)
    inner = getattr(options, "model_client", None)
    if limiter is None or isinstance(inner, LimitedModelClient):
        return inner
    return LimitedModelClient(
        inner, limiter, api_key=getattr(options, "api_key", None), base_url=getattr(options, "base_url", None)
    )


def step_model_client(ctx: WorkerContext, options: Any, replay: dict[str, Any] | None = None) -> Any:
    """:func:`limited_client`; with ``replay`` (a persisted assistant turn, wire
    format) a :class:`~lattice_worker.runtime.run.replay.ReplayModelClient` whose
    first request returns that turn and whose later ones go to that client."""
    client = limited_client(ctx, options)
    if replay is None:
        return client
    return ReplayModelClient(
        replay, client, api_key=getattr(options, "api_key", None), base_url=getattr(options, "base_url", None)
    )


def limit_agent(ctx: WorkerContext, spec: Any) -> Any:
    """A fresh session of ``spec`` (an ``AgentSpec``) with its model client under
    the shared limits, or ``None`` without limits (the caller spawns it as before)."""
    if limiter_for(ctx) is None:
        return None
    from ...agent.agent import Agent

    options = spec.options.model_copy(update={"model_client": limited_client(ctx, spec.options)})
    return Agent(options, bare=options.workspace is False)


@contextmanager
def lead_scope(ctx: WorkerContext, run_id: str, lease: Any) -> Iterator[CallScope]:
    """The scope of a lead segment's calls (it may end to wait when it holds a ``lease``)."""
    scope = CallScope(
        run_id=run_id,
        scope="lead",
        emit=lambda event: ctx.events.emit(run_id, event),
        suspendable=lease is not None and limiter_for(ctx) is not None and steps_may_end.get(),
        who={"member": "lead"},
    )
    token = current_scope.set(scope)
    try:
        yield scope
    finally:
        current_scope.reset(token)


@contextmanager
def item_scope(
    ctx: WorkerContext, run_id: str | None, member: str, message: Any, journal: Any
) -> Iterator[CallScope | None]:
    """The scope of a member's calls on ``message`` of run ``run_id`` (``None``
    without a run). It may end to wait when the attempt is journaled
    (``journal``: its history and journal are persisted under the claim); the
    journal then notes the wait (kind ``"rate_limit"``), so the member's work
    ends ``parked`` and :func:`item_waits` takes over."""
    if not run_id:
        yield None
        return
    item = str(message.work_item_id or message.id)

    def noted(wait: TurnWait | None) -> None:
        if wait is None:  # the step goes on after all
            if isinstance(journal.waiting, dict) and journal.waiting.get("kind") == "rate_limit":
                journal.waiting = None
            return
        journal.waiting = {
            "id": f"{message.id}/ratelimit",
            "kind": "rate_limit",
            "reason": f"the model call waits {wait.seconds:.1f} s for its turn ({wait.limit})",
            "limit": wait.limit,
        }

    scope = CallScope(
        run_id=run_id,
        scope=f"item:{item}",
        emit=lambda event: ctx.events.emit(run_id, event),
        suspendable=journal is not None
        and bool(message.claim_token)
        and limiter_for(ctx) is not None
        and steps_may_end.get(),
        who={"member": member, "work_item_id": message.work_item_id, "message_id": message.id},
        on_wait=noted if journal is not None else None,
    )
    token = current_scope.set(scope)
    try:
        yield scope
    finally:
        current_scope.reset(token)


async def not_due(ctx: WorkerContext, messages: list[Any]) -> set[str]:
    """Ids of the pending ``messages`` whose member call holds a turn that has
    not come (a doorbell rung early -- the reaper's for a message pending
    longer than a lease -- leaves them: claiming one would only give it back).
    Empty without limits. One pipelined read."""
    if limiter_for(ctx) is None:
        return set()
    linked = [
        (m, m.metadata.get("run_id"))
        for m in messages
        if m.work_item_id and isinstance(m.metadata.get("run_id"), str) and m.metadata.get("run_id")
    ]
    if not linked:
        return set()
    client = await ctx.redis()
    holds = [hold_key(ctx.prefix, run_id, f"item:{m.work_item_id}") for m, run_id in linked]
    async with client.pipeline(transaction=False) as pipe:
        clock = await pipelined_time(client, pipe, holds[0])
        for hold in holds:
            pipe.get(hold)
        replies = with_time(clock, await pipe.execute())
    now = int(replies[0][0]) * 1000 + int(replies[0][1]) // 1000
    out = set()
    for (m, _), raw in zip(linked, replies[1:], strict=True):
        held = decode_hold(raw)
        if held is not None and held[1] > now + int(SHORT_WAIT_SECONDS * 1000):
            out.add(m.id)
    return out


async def lead_waits(
    ctx: WorkerContext, team: str, run_id: str, lease: Any, wait: TurnWait, final: Any, usage: Any
) -> str:
    """End the segment of run ``run_id`` (team ``team``) whose call waits for its
    turn: the segment's usage, history and events are written under the lease,
    the run becomes ``resuming`` without a lease, and ``resume_lead`` is enqueued
    for the turn. Returns ``"rate_limited"``. Raises ``RunLeaseLostError`` when
    the lease was lost (nothing more written)."""
    fence = lease.token
    await ctx.usage.add(run_id, getattr(final, "usage", None), known=usage, fence=fence)
    await ctx.writer.sync(fence)  # the history (it ends with the call's user message) and events

    def failed(exc: BaseException) -> BaseException:
        error = ctx.runs.script_error(exc, run_id, "lead_wait")
        if isinstance(error, RunLeaseLostError):
            lease.mark_lost()
        return error

    record = ctx.runs.keys(run_id).record
    command = ("evalsha", _LEAD_WAIT_SHA, 1, record, fence, now_ms(), wait.resume_at_ms, wait.limit or "")
    await ctx.writer.write(
        [command, ("zrem", ctx.runs.leases_key, run_id)], scripts=(LEAD_WAIT_LUA,), on_error=failed
    )
    lease.end()  # the run waits without a lease: renewals stop quietly
    ctx.steps.resume(run_id, team, countdown=wait.seconds)
    return "rate_limited"


async def item_waits(ctx: WorkerContext, message: Any, wait: TurnWait) -> str:
    """End a member's attempt at ``message`` whose call waits for its turn: what
    it queued is written (fenced by its claim), the message goes back to
    ``pending`` (its FIFO place kept) and its doorbell is rung for the turn.
    Returns ``"rate_limited"``; ``"lost"`` when the claim was taken meanwhile."""
    from lattice_mailbox.base import ClaimError

    await ctx.writer.sync(message.claim_token)
    try:
        await ctx.mailbox.complete(message.id, message.claim_token, "pending")
    except (ClaimError, LookupError):
        return "lost"
    ctx.steps.ring(message.to, message.id, countdown=wait.seconds)
    return "rate_limited"


__all__ = [
    "LEAD_WAIT_LUA",
    "item_scope",
    "item_waits",
    "lead_scope",
    "lead_waits",
    "not_due",
    "steps_may_end",
    "waits_in_place",
    "limit_agent",
    "limited_client",
    "limiter_for",
]
