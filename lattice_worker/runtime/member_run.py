"""The member side of a distributed run: the ``deliver`` doorbell body.

DESIGN.md section 5, steps 3, 5 and 6; issue 6 items 3 and 4. ``deliver``
claims the oldest pending message of one member mailbox; nothing claimed means
a duplicated doorbell or a redelivered Celery message, and the task is a
no-op. Otherwise the member runs on the message exactly as in-process
(:func:`~lattice_worker.team.work.run_work_item`: reply upstream, failure
report, no-reply diagnostic), while a :class:`~lattice_worker.runtime.leases.LeaseKeeper`
renews the claim; a run that loses its claim is aborted and its outcome
discarded (the successor owns the message). The outcome completes the work
item in the run store: the completion that empties a suspended run's wait set
enqueues ``resume_lead``; queued items of the run that may now start get their
doorbells rung.

Member modes (:func:`~lattice_worker.runtime.registry.member_mode`):

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
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_client.models import RunRecord, RunResult
from lattice_mailbox.base import ClaimError, InvalidTransitionError
from lattice_mailbox.message import MessageStatus, TeamMessage

from ..agent.abort import AbortController
from ..agent.agent import Agent
from ..agent.history_stores import RedisHistoryStore
from ..team.events import TeamAgentEvent, TeamMessageEvent
from ..team.ids import split_mailbox_id
from ..team.member import TeamMember
from ..team.member_tools import MailboxToolState, set_message_status
from ..team.team import Team
from ..team.work import WorkItemOutcome, run_work_item
from .leases import LeaseKeeper
from .registry import member_mode
from .worker_context import RUN_KEY_TTL_SECONDS, WorkerContext

logger = logging.getLogger("lattice_worker.runtime")

CHILD_CLAIM_SECONDS = 10 * 365 * 24 * 3600.0
"""How long (seconds) a nested team's message stays claimed once its child run
exists: in effect no expiry, the child run holds lead leases of its own."""


def _public(message: TeamMessage) -> dict[str, Any]:
    data = message.to_json_dict()  # a fresh dict: no need to copy the model first
    data["claim_token"] = None
    return data


async def deliver(ctx: WorkerContext, mailbox_id: str) -> str:
    """Body of ``lattice.deliver(mailbox_id)``: claim one message and run its member.

    Returns what happened: ``"invalid"`` (not a ``<team>::<member>`` id),
    ``"unknown"`` (no such team/member here), ``"idle"`` (nothing to claim --
    a duplicate doorbell), ``"cancelled"``, ``"child"`` (a nested team's run
    was started), ``"lost"`` (the claim was lost; outcome discarded), or the
    item's status (``"done"``, ``"failed"``, ``"open"``)."""
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
    claimed = await ctx.mailbox.claim_next(
        mailbox_id,
        lease_s=ctx.settings.lease_seconds,
        worker_id=ctx.worker_id,
        max_in_flight=1 if mode == "session" else None,
    )
    if claimed is None:
        return "idle"
    try:
        return await process_claimed(ctx, team, member, claimed)
    finally:
        await ctx.flush_events()
        if mode == "session":
            await _ring_if_pending(ctx, mailbox_id)


async def _ring_if_pending(ctx: WorkerContext, mailbox_id: str) -> None:
    # A serial mailbox refuses claims while busy, so a doorbell rung meanwhile was
    # a no-op: ring again for whatever is still waiting.
    try:
        counts = await ctx.mailbox.counts(mailbox_id)
    except Exception:
        logger.warning("could not count %s", mailbox_id, exc_info=True)
        return
    if counts.get("pending", 0) > 0:
        ctx.ring(mailbox_id)


async def process_claimed(ctx: WorkerContext, team: Team, member: TeamMember, message: TeamMessage) -> str:
    """Run ``member`` on the claimed ``message`` and complete its work item
    (see :func:`deliver`; also used by ``lattice drain``)."""
    link = _run_link(message) or await ctx.run_of(message.work_item_id)
    run_id = link[0] if link else None
    status = await ctx.runs.status(run_id) if run_id else None  # the status alone: cheaper than the record
    token = message.claim_token
    if run_id and status is not None and status.finished:
        record = await ctx.runs.get(run_id)
        if record is not None:
            return await _cancel_message(ctx, team, message, record)

    async def emit(event: Any) -> None:
        if run_id:
            await ctx.emit(run_id, event)

    await emit(TeamMessageEvent(subtype="claimed", team=team.name, message=_public(message)))
    if member_mode(member) == "team":
        return await start_child_run(ctx, team, member, message, run_id)

    controller = AbortController()
    agent = session_agent(ctx, member, message.to) if member.kind == "agent" else None

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
    if token and message.lease_until is not None:
        async with keeper:
            outcome = await run_work_item(
                team,
                member,
                message,
                mailbox=ctx.mailbox,
                token=token,
                signal=controller.signal,
                emit=emit,
                agent=agent,
                stream_events=False,  # ctx.emit does not store token-level events
            )
    else:
        outcome = await run_work_item(
            team,
            member,
            message,
            mailbox=ctx.mailbox,
            token=token,
            signal=controller.signal,
            emit=emit,
            agent=agent,
            stream_events=False,
        )
    # Only a refused fenced write means the claim was lost: every other outcome was
    # written under this claim's token. The keeper also reports "missing" once the
    # member closed the message itself (team_reply) and went on working: not a loss.
    if (outcome.error or {}).get("code") == "claim_lost":
        logger.warning("member %s lost its claim on %s; its outcome is discarded", member.name, message.id)
        return "lost"
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
    # lead task messages of a distributed run carry it (lead_run.RunLinkingMailbox)
    run_id, team = message.metadata.get("run_id"), message.metadata.get("team")
    if isinstance(run_id, str) and run_id and isinstance(team, str) and team:
        return run_id, team
    return None


def session_agent(ctx: WorkerContext, member: TeamMember, mailbox_id: str) -> Agent:
    """A session member's ``Agent`` rebuilt over its persisted conversation
    (Redis list ``<prefix>:session:<mailbox_id>``), with the member's tools
    (mailbox tools included). Other options are the member agent's own."""
    base: Agent = member.agent
    store = RedisHistoryStore(ctx.client, ctx.session_key(mailbox_id), fail_on_error=True)
    options = base.options.model_copy(update={"history_store": store, "tools": list(base.tools)})
    return Agent(options, bare=base.bare)


async def complete_work_item(
    ctx: WorkerContext, run_id: str, team_name: str, work_item_id: str, outcome: WorkItemOutcome
) -> None:
    """Record ``outcome`` for the run; ring the doorbells of the run's items
    that may start now and enqueue ``resume_lead`` when this was the last one.

    The message is already finished in the mailbox at this point, so a Redis
    hiccup here is retried (``complete_item`` is idempotent) rather than left
    to Celery: a redelivered ``deliver`` would find nothing to claim. When the
    run has already ended (cancelled, failed, completed), its lead will never
    read the outcome's upstream message: it is closed as ``cancelled``."""
    data = outcome.to_dict()
    result = await _complete_item(ctx, run_id, work_item_id, data)
    if not result.recorded:
        # The message was claimed before the lead registered its item (its task
        # batch was still running): leave the outcome where the lead looks right
        # after registering, then try again. Both sides write before they read,
        # so at least one of them completes the item (completion is idempotent).
        await ctx.save_early_outcome(work_item_id, data)
        result = await _complete_item(ctx, run_id, work_item_id, data)
    apply_completion(ctx, run_id, team_name, result)
    if outcome.report is not None and result.run_status in ("completed", "failed", "cancelled"):
        from .lead_run import close_unread_reports

        await close_unread_reports(ctx.mailbox, [outcome.report.id])


def apply_completion(ctx: WorkerContext, run_id: str, team_name: str, result: Any) -> None:
    """Act on a ``CompleteResult``: ring the doorbells of the items it lets start
    and enqueue ``resume_lead`` when it emptied a suspended run's wait set."""
    for item in result.dispatch:
        ctx.ring(item["mailbox_id"])
    if result.resume:
        ctx.enqueue_resume(run_id, team_name)


_COMPLETE_ATTEMPTS = 6


async def _complete_item(ctx: WorkerContext, run_id: str, work_item_id: str, data: dict[str, Any]) -> Any:
    # Connection errors and timeouts are retried (up to 6 attempts, waiting 0.1, 0.2, 0.4,
    # 0.8, 1.6 s in between; the last error is raised); any other error at once.
    attempt = 1
    while True:
        try:
            # with the queued events, in one round trip: the member's events
            # precede the resumed lead's
            call, source = ctx.runs.complete_item_call(run_id, work_item_id, data)
            (reply,) = await ctx.write(
                [call],
                scripts=(source,),
                on_error=lambda exc: ctx.runs.script_error(exc, run_id, "complete_item"),
            )
            return ctx.runs.complete_reply(reply)
        except (RedisConnectionError, RedisTimeoutError):
            if attempt >= _COMPLETE_ATTEMPTS:
                raise
            await asyncio.sleep(min(3.0, 0.1 * 2 ** (attempt - 1)))
            attempt += 1


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
    await ctx.emit(
        record.run_id,
        TeamMessageEvent(subtype="cancelled", team=team.name, message=_public(cancelled), error=failure),
    )
    outcome = WorkItemOutcome(
        message=cancelled, status="cancelled", content=failure["message"], error=failure
    )
    if message.work_item_id:
        await ctx.runs.complete_item(record.run_id, message.work_item_id, outcome.to_dict())
    return "cancelled"


# -- nested teams ----------------------------------------------------------------------------


async def send_failure_report(
    mailbox: Any,
    message: TeamMessage,
    *,
    member: str,
    team: str,
    failure: dict[str, Any],
    kind: str = "failure",
) -> TeamMessage:
    """Send the failure report of the work item of task ``message`` upstream (to
    its sender: same thread and work item, ``reply_to`` = the message), as a
    member's failure reaches its lead in-process. ``failure``: ``{"code",
    "message", "error_type"}``; ``kind``: the report's ``metadata["kind"]``
    (``"failure"``, or ``"diagnostic"`` when the runtime, not the member, reports)."""
    text = f'Work item {message.work_item_id} for member "{member}" failed ({failure["code"]}): {failure["message"]}'
    return await mailbox.send(
        message.to,
        message.from_,
        text,
        thread_id=message.thread_id,
        work_item_id=message.work_item_id,
        reply_to=message.id,
        metadata={"kind": kind, "member": member, "status": "failed", "error": failure, "team": team},
    )


def child_claim_key(ctx: WorkerContext, child_id: str) -> str:
    """The Redis string holding the current claim token of the message a child
    run serves (it changes when the message is re-claimed after a crash)."""
    return f"{ctx.prefix}:child:{child_id}:claim"


def child_run_id(message: TeamMessage) -> str:
    """The run id of the child run serving ``message`` (deterministic, so a
    duplicate claim can never start two child runs)."""
    return f"child.{message.id}"


async def start_child_run(
    ctx: WorkerContext, team: Team, member: TeamMember, message: TeamMessage, run_id: str | None
) -> str:
    """Start the nested team's own lead run for ``message`` (the child run
    replies upstream when it ends); see the module doc for the claim. Returns
    ``"child"``, or ``"lost"`` when the claim was taken meanwhile."""
    nested: Team = member.agent
    child_id = child_run_id(message)
    existing = False
    try:
        await ctx.runs.create(
            child_id,
            nested.name,
            message.content,
            metadata={
                "lattice_parent": {
                    "team": team.name,
                    "member": member.name,
                    "work_item_id": message.work_item_id,
                    "claim_token": message.claim_token,
                    "parent_team_run": run_id,
                }
            },
            parent={"run_id": run_id or "", "message_id": message.id, "mailbox_id": message.to},
        )
    except ValueError:
        existing = True
    if message.claim_token:
        client = await ctx.redis()
        await client.set(child_claim_key(ctx, child_id), message.claim_token, ex=RUN_KEY_TTL_SECONDS)
        if message.lease_until is not None:
            try:
                await ctx.mailbox.extend_lease(message.id, message.claim_token, CHILD_CLAIM_SECONDS)
            except ClaimError as exc:
                logger.warning("claim of %s lost before its child run was handed over: %s", message.id, exc)
                return "lost"
    if existing:
        child = await ctx.runs.get(child_id)
        logger.info("child run %s already exists (a re-claim after a crash); not starting it twice", child_id)
        if child is not None and child.status.finished and child.result is not None:
            await reply_from_child(ctx, child, child.result)  # it ended while nobody held the message
        return "child"
    if run_id:
        await ctx.emit(
            run_id,
            TeamAgentEvent(
                subtype="start",
                team=team.name,
                member=member.name,
                mailbox=message.to,
                message_id=message.id,
                work_item_id=message.work_item_id,
            ),
        )
    ctx.enqueue_run_lead(child_id, nested.name)
    return "child"


async def reply_from_child(ctx: WorkerContext, child: RunRecord, result: RunResult) -> None:
    """A child run ended: reply upstream for the member it served (its final
    text is the reply, as in-process) or send a failure report, close the
    parent message, and complete the parent's work item."""
    parent = child.parent
    assert parent is not None
    info = dict(child.metadata.get("lattice_parent") or {})
    team_name = str(info.get("team") or split_mailbox_id(parent.mailbox_id)[0])
    member_name = str(info.get("member") or split_mailbox_id(parent.mailbox_id)[1])
    client = await ctx.redis()
    token = await client.get(child_claim_key(ctx, child.run_id)) or info.get("claim_token") or None
    team = ctx.registry.get(team_name)
    message = await ctx.mailbox.get(parent.message_id)
    if team is None or message is None:
        logger.warning(
            "child run %s: parent team %s or message %s unknown", child.run_id, team_name, parent.message_id
        )
        return
    run_id = parent.run_id or None

    async def emit(event: Any) -> None:
        if run_id:
            await ctx.emit(run_id, event)

    state = MailboxToolState(
        team_name=team.name,
        self_name=member_name,
        member_names=[m.name for m in team.members],
        mailbox=ctx.mailbox,
        current=message,
        token=token,
        emit=emit,
    )
    try:
        if result.status == "completed":
            reply = await state.reply(
                result.result or "(empty result)", None, structured_result=result.structured_result
            )
            outcome = WorkItemOutcome(
                message=message.model_copy(update={"status": MessageStatus.DONE, "claim_token": None}),
                status="done",
                content=reply.content,
                structured_result=result.structured_result,
                report=reply,
            )
        else:
            outcome = await _fail_upstream(ctx, team, member_name, message, token, result, emit)
    except Exception as exc:
        logger.warning("child run %s could not reply upstream: %s", child.run_id, exc)
        return
    await emit(
        TeamAgentEvent(
            subtype="end",
            team=team.name,
            member=member_name,
            mailbox=message.to,
            message_id=message.id,
            work_item_id=message.work_item_id,
            result="success" if result.status == "completed" else "error",
        )
    )
    if run_id and message.work_item_id:
        await complete_work_item(ctx, run_id, team.name, message.work_item_id, outcome)


async def _fail_upstream(
    ctx: WorkerContext,
    team: Team,
    member: str,
    message: TeamMessage,
    token: str | None,
    result: RunResult,
    emit: Any,
) -> WorkItemOutcome:
    failure = {
        "code": "child_run_failed",
        "message": result.error or f"the child run ended {result.status}",
        "error_type": None,
    }
    await set_message_status(ctx.mailbox, message.id, MessageStatus.FAILED, token)
    failed = message.model_copy(update={"status": MessageStatus.FAILED, "claim_token": None})
    report = await send_failure_report(ctx.mailbox, message, member=member, team=team.name, failure=failure)
    await emit(TeamMessageEvent(subtype="failed", team=team.name, message=_public(failed), error=failure))
    return WorkItemOutcome(
        message=failed, status="failed", content=report.content, error=failure, report=report
    )


__all__ = [
    "apply_completion",
    "child_run_id",
    "complete_work_item",
    "deliver",
    "process_claimed",
    "reply_from_child",
    "send_failure_report",
    "session_agent",
    "start_child_run",
]
