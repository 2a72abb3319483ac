"""The member side of a distributed run: the ``deliver`` doorbell body.

docs/architecture.md, steps 3, 5 and 6. ``deliver``
claims the oldest pending message of one member mailbox; nothing claimed means
a duplicated doorbell or a redelivered Celery message, and the task is a
no-op. Otherwise the member runs on the message exactly as in-process
(:func:`~lattice_worker.team.work.run_work_item`: reply upstream, failure
report, no-reply diagnostic), while a :class:`~lattice_worker.runtime.run.renewal.LeaseKeeper`
renews the claim; a run that loses its claim is aborted and its outcome
discarded (the successor owns the message). The outcome completes the work
item in the run store: the completion that empties a suspended run's wait set
enqueues ``resume_lead``; queued items of the run that may now start get their
doorbells rung.

Member modes (:func:`~lattice_worker.runtime.member.step.member_mode`):

* ``template`` (an ``AgentSpec``): claimed with a lease, a fresh session per
  item, items run in parallel across workers;
* ``session`` (a live ``Agent`` / AgentLike): claimed with ``max_in_flight=1``
  so the mailbox is serial; an ``Agent``'s history is kept in Redis per mailbox
  and rebuilt for every item;
* ``team`` (a nested team): the message is claimed with a lease and becomes
  a *child run* of that team (``run_lead`` on its lead queue, ``parent`` =
  this message); once the child run exists the claim is extended for
  :data:`CHILD_CLAIM_SECONDS` (the child run's own lead lease covers crashes
  from then on). A worker dying between the claim and that point leaves a
  claim whose lease expires: the message is re-claimed and the (deterministic)
  child run reused, under the new claim token. When the child run ends,
  :func:`reply_from_child` replies upstream and completes the work item.

A message whose run was cancelled is marked ``cancelled`` and not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

from redis.exceptions import ConnectionError as RedisConnectionError

from lattice_client.errors import RunLeaseLostError
from lattice_client.models import RunRecord
from lattice_mailbox.base import ClaimError, InvalidTransitionError
from lattice_mailbox.connections import UnreachableError
from lattice_mailbox.message import MessageStatus, TeamMessage

from ...agent.abort import AbortController
from ...agent.call_gate import current_call_gate
from ...team.events import TeamMessageEvent
from ...team.ids import split_mailbox_id
from ...team.mailbox_state import set_message_status
from ...team.member import TeamMember
from ...team.team import Team
from ...team.work import WorkItemOutcome, run_work_item
from ..limits.hook import item_scope, item_waits, limit_agent, not_due
from ..run.budget import member_gate
from ..run.completion import complete_work_item
from ..run.context import WorkerContext
from ..run.events import current_fence, public_message
from ..run.trace import member_trace
from .child_runs import start_child_run
from .journal import journaled_member
from .lease import ABORT_GRACE_SECONDS, LeaseKeeper, WorkAbandoned, until_aborted
from .session import journaled_session, session_agent, unjournaled_session

logger = logging.getLogger("lattice_worker.runtime")

MemberMode = Literal["template", "session", "team"]


def member_mode(member: TeamMember) -> MemberMode:
    """How the distributed runtime runs ``member``: ``"template"`` (an
    ``AgentSpec``), ``"team"`` (a nested ``Team``) or ``"session"`` (a live
    ``Agent`` or any other AgentLike: serial per mailbox)."""
    kind = member.kind
    if kind == "spec":
        return "template"
    if kind == "team":
        return "team"
    return "session"


async def deliver(ctx: WorkerContext, mailbox_id: str, message_id: str | None = None) -> str:
    """Body of ``lattice.deliver(mailbox_id[, message_id])``: claim one message and run its member.

    With ``message_id`` (the doorbell of a work item its run let start) that
    message is claimed, if it is still pending. Without (a doorbell rung
    again: the reaper, a serial mailbox), the oldest pending message whose run
    lets it start is (:func:`startable`). A run's ``max_concurrent_work_items``
    so holds exactly even when runs share the member's mailbox: a doorbell
    never claims a work item its run still queues.

    Returns what happened: ``"invalid"`` (not a ``<team>::<member>`` id),
    ``"unknown"`` (no such team/member here), ``"idle"`` (nothing to claim --
    a duplicate doorbell), ``"cancelled"``, ``"child"`` (a nested team's run
    was started), ``"lost"`` (the claim was lost; outcome discarded),
    ``"parked"`` / ``"awaiting_approval"`` (a tool call waits for a person;
    the message is parked, no worker waits), ``"budget_reached"`` (parked on
    the run's token budget), or the item's status
    (``"done"``, ``"failed"``, ``"open"``)."""
    try:
        team_name, member_name = split_mailbox_id(mailbox_id)
    except ValueError:
        logger.warning("deliver: %r is not a team mailbox id", mailbox_id)
        return "invalid"
    team = ctx.registry.get(team_name)
    member = ctx.registry.member(team_name, member_name) if team is not None else None
    if team is None or member is None:
        logger.warning(
            "deliver: mailbox %s is not served by this worker (teams: %s)", mailbox_id, ctx.registry.names()
        )
        return "unknown"
    mode = member_mode(member)
    claimed = await claim_startable(ctx, mailbox_id, mode, message_id)
    if claimed is None:
        return "idle"
    try:
        return await process_claimed(ctx, team, member, claimed)
    finally:
        await ctx.writer.flush()
        if mode == "session":
            await _ring_if_pending(ctx, mailbox_id)


STARTABLE_SCAN = 50
"""How many pending messages of a mailbox a doorbell without a message id looks at."""


async def startable(ctx: WorkerContext, mailbox_id: str, limit: int = 5) -> list[str]:
    """Ids of up to ``limit`` pending messages of ``mailbox_id``, oldest first,
    that their run lets start: all but the task messages whose work item the
    run still queues (state ``queued``: ``max_concurrent_work_items`` of its
    items are running) and those whose member call holds a turn that has not
    come (shared rate limits: :func:`~lattice_worker.runtime.limits.hook.not_due`).
    Looks at the :data:`STARTABLE_SCAN` oldest (one read of the mailbox, one
    pipelined read of the runs' item states, one of the held turns with limits)."""
    pending = await ctx.mailbox.inbox(mailbox_id, "pending", limit=STARTABLE_SCAN)
    linked = [(m, _run_link(m)) for m in pending]
    checks = [(m, link[0]) for m, link in linked if link is not None and m.work_item_id]
    states: dict[str, Any] = {}
    if checks:
        client = await ctx.redis()
        async with client.pipeline(transaction=False) as pipe:
            for m, run_id in checks:
                pipe.hget(ctx.runs.keys(run_id).state, m.work_item_id)
            for (m, _), state in zip(checks, await pipe.execute(), strict=True):
                states[m.id] = state.decode() if isinstance(state, bytes) else state
    later = await not_due(ctx, pending)  # a member call whose turn has not come (rate limits)
    return [m.id for m in pending if states.get(m.id) != "queued" and m.id not in later][:limit]


async def claim_startable(
    ctx: WorkerContext, mailbox_id: str, mode: str, message_id: str | None = None
) -> TeamMessage | None:
    """Claim ``message_id`` of ``mailbox_id`` (while pending), or without one
    the oldest pending message its run lets start (:func:`startable`), with
    the settings' lease; a ``session`` member's mailbox is serial. ``None``:
    nothing claimed."""
    for candidate in [message_id] if message_id else await startable(ctx, mailbox_id):
        claimed = await _claim(ctx, mailbox_id, mode, candidate)
        if claimed is not None or mode == "session":  # (a busy serial mailbox refuses them all)
            return claimed
    return None


CLAIM_ATTEMPTS = 3
"""How many times a claim whose connection was lost (and that did not happen:
the mailbox's claim token lookup says so) is made again before the error goes
to Celery's retry."""


async def _claim(ctx: WorkerContext, mailbox_id: str, mode: str, message_id: str) -> TeamMessage | None:
    for attempt in range(1, CLAIM_ATTEMPTS + 1):
        try:
            return await ctx.mailbox.claim_next(
                mailbox_id,
                lease_s=ctx.settings.lease_seconds,
                worker_id=ctx.worker_id,
                max_in_flight=1 if mode == "session" else None,
                message_id=message_id,
            )
        except UnreachableError:
            raise  # no server to claim from (after the connect retries)
        except RedisConnectionError:
            # the connection was lost and the claim did not happen (a claim that
            # did is returned by claim_next itself): claiming again is safe
            if attempt == CLAIM_ATTEMPTS:
                raise
    return None


async def _ring_if_pending(ctx: WorkerContext, mailbox_id: str) -> None:
    # A serial mailbox refuses claims while busy, so a doorbell rung meanwhile was
    # a no-op: ring again for whatever is still waiting.
    try:
        counts = await ctx.mailbox.counts(mailbox_id)
    except Exception:
        logger.warning("could not count %s", mailbox_id, exc_info=True)
        return
    if counts.get("pending", 0) > 0:
        ctx.steps.ring(mailbox_id)


async def process_claimed(ctx: WorkerContext, team: Team, member: TeamMember, message: TeamMessage) -> str:
    """Run ``member`` on the claimed ``message`` and complete its work item
    (see :func:`deliver`; also used by ``lattice drain``). The run's events
    it emits are fenced by the claim (``RunStore.item_events_fence``)."""
    link = _run_link(message) or await ctx.links.run_of(message.work_item_id)
    fence = None
    if link and message.work_item_id and message.claim_token:
        try:
            fence = ctx.runs.item_events_fence(
                link[0], message.work_item_id, message.attempts, message.claim_token
            )
        except ValueError:
            logger.warning("message %s: its run events are not fenced", message.id, exc_info=True)
    reset = current_fence.set(fence)
    try:
        return await _process(ctx, team, member, message, link)
    finally:
        current_fence.reset(reset)


async def _process(
    ctx: WorkerContext, team: Team, member: TeamMember, message: TeamMessage, link: tuple[str, str] | None
) -> str:
    run_id = link[0] if link else None
    status = None
    if run_id:  # the status and the parent alone (cheaper than the record); the parent seeds the emitter
        status, parent = await ctx.runs.status_and_parent(run_id)
        if status is not None:
            ctx.events.note_parent(run_id, parent)
    token = message.claim_token
    if run_id and status is not None and status.finished:
        record = await ctx.runs.get(run_id)
        if record is not None:
            return await _cancel_message(ctx, team, message, record)

    async def emit(event: Any) -> None:
        if run_id:
            await ctx.events.emit(run_id, event)

    await emit(TeamMessageEvent(subtype="claimed", team=team.name, message=public_message(message)))
    if member_mode(member) == "team":
        return await start_child_run(ctx, team, member, message, run_id)

    controller = AbortController()
    agent = None
    journal = None
    resume = False
    if (
        run_id
        and token
        and message.work_item_id
        and member.kind in ("spec", "agent")
        and ctx.settings.tool_journal
    ):
        begin = journaled_member if member.kind == "spec" else journaled_session
        try:
            agent, journal, resume = await begin(ctx, team.name, member, message, run_id)
        except RunLeaseLostError:
            logger.warning(
                "member %s: a later claim of %s already began; nothing done", member.name, message.id
            )
            return "lost"

    async def check() -> str | None:
        if not run_id:
            return None
        current = await ctx.runs.get(run_id)
        if current is not None and current.status.value == "cancelled":
            return "the run was cancelled"
        return None

    keeper = _ItemLeaseKeeper(
        ctx.mailbox, message.id, token or "", ctx.settings.lease_seconds, controller, check=check
    )
    # a claim with a lease is renewed while the member works
    renewing = keeper if token and message.lease_until is not None else contextlib.nullcontext()
    if agent is None and member.kind == "agent":  # not journaled: the item starts (over) here
        try:
            agent = await unjournaled_session(ctx, member, message, run_id)
        except RunLeaseLostError:
            logger.warning(
                "member %s: a later claim took the session before %s began", member.name, message.id
            )
            return "lost"
    if agent is None and member.kind == "spec":
        agent = limit_agent(ctx, member.agent)  # None without LATTICE_MODEL_LIMITS
    tracer, trace_context = member_trace(team, run_id, message)  # (None, None): an untraced run
    gate_token = current_call_gate.set(member_gate(ctx, run_id, message, journal))  # None: no budget
    try:
        # a session member's model call waits for its turn in place: its message, released
        # to wait, would let the next item of its serial mailbox into the conversation
        waits = journal if member.kind == "spec" else None
        with item_scope(ctx, run_id, member.name, message, waits) as calls:
            async with renewing:
                work = run_work_item(
                    team,
                    member,
                    message,
                    mailbox=ctx.mailbox,
                    token=token,
                    signal=controller.signal,
                    emit=emit,
                    tracer=tracer,
                    trace_context=trace_context,
                    agent=agent,
                    stream_events=False,  # the event emitter does not store token-level events
                    journal=journal,
                    resume=resume,
                )
                try:
                    outcome = await until_aborted(work, controller.signal)
                except WorkAbandoned as abandoned:  # a tool went on past the abort: its slot is freed
                    logger.warning(
                        "member %s: the work on %s was cancelled %.1f s after %s",
                        member.name,
                        message.id,
                        ABORT_GRACE_SECONDS,
                        abandoned.reason,
                    )
                    return "lost" if keeper.lost is not None else "cancelled"
    finally:
        current_call_gate.reset(gate_token)
    # Only a refused fenced write means the claim was lost: every other outcome was
    # written under this claim's token. The keeper also reports "missing" once the
    # member closed the message itself (team_reply) and went on working: not a loss.
    if (outcome.error or {}).get("code") == "claim_lost":
        logger.warning("member %s lost its claim on %s; its outcome is discarded", member.name, message.id)
        return "lost"
    if outcome.status == "parked" and calls is not None and calls.wait is not None:
        return await item_waits(ctx, message, calls.wait)  # a model call waits for its turn
    if outcome.status == "parked":  # a call waits for a person; the work item stays open
        kind = (journal.waiting or {}).get("kind") if journal is not None else None
        return {"approval": "awaiting_approval", "budget": "budget_reached"}.get(kind or "", "parked")
    if link is not None:
        await complete_work_item(ctx, link[0], link[1], message.work_item_id or "", outcome)
    return outcome.status


class _ItemLeaseKeeper(LeaseKeeper):
    """A :class:`LeaseKeeper` that makes its renewal task only when the first
    renewal is due (a timer until then): most work items end long before a
    third of the lease, and a task per item, cancelled unused, costs more than
    a timer. Renewals, checks and their timing are :class:`RenewalLoop`'s."""

    _timer: asyncio.TimerHandle | None = None
    _renewing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _ItemLeaseKeeper:
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._start)
        return self

    def _start(self) -> None:
        self._timer = None
        self._renewing = asyncio.get_running_loop().create_task(
            self._renew(), name=f"lease:{self.message_id}"
        )

    async def _renew(self) -> None:
        # the first renewal is due now; then as RenewalLoop._run: every interval
        while True:
            if not await self.renew_once() or not await self.after_renewal():
                return
            await asyncio.sleep(self.interval)

    async def __aexit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _run_link(message: TeamMessage) -> tuple[str, str] | None:
    # lead task messages of a distributed run carry it (lead.dispatch.RunLinkingMailbox)
    run_id, team = message.metadata.get("run_id"), message.metadata.get("team")
    if isinstance(run_id, str) and run_id and isinstance(team, str) and team:
        return run_id, team
    return None


async def _cancel_message(ctx: WorkerContext, team: Team, message: TeamMessage, record: RunRecord) -> str:
    failure = {
        "code": "aborted",
        "message": f"run {record.run_id} is {record.status.value}",
        "error_type": "AbortError",
    }
    try:
        await set_message_status(ctx.mailbox, message.id, MessageStatus.CANCELLED, message.claim_token)
    except (ClaimError, InvalidTransitionError, LookupError) as exc:
        logger.info("message %s of finished run %s: %s", message.id, record.run_id, exc)
        return "cancelled"
    cancelled = message.model_copy(update={"status": MessageStatus.CANCELLED, "claim_token": None})
    await ctx.events.emit(
        record.run_id,
        TeamMessageEvent(
            subtype="cancelled", team=team.name, message=public_message(cancelled), error=failure
        ),
    )
    outcome = WorkItemOutcome(
        message=cancelled, status="cancelled", content=failure["message"], error=failure
    )
    if message.work_item_id:
        await ctx.runs.complete_item(record.run_id, message.work_item_id, outcome.to_dict())
    return "cancelled"


__all__ = [
    "MemberMode",
    "member_mode",
    "CLAIM_ATTEMPTS",
    "STARTABLE_SCAN",
    "claim_startable",
    "deliver",
    "process_claimed",
    "session_agent",
    "startable",
]
