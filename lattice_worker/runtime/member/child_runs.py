"""Nested teams: a member that is a team serves its message as a *child run*.

The message is claimed with a lease and becomes a child run of that team
(``run_lead`` on its lead queue, ``parent`` = this message); once the child
run exists the claim is extended for :data:`CHILD_CLAIM_SECONDS` (the child
run's own lead lease covers crashes from then on). A worker dying between the
claim and that point leaves a claim whose lease expires: the message is
re-claimed and the (deterministic) child run reused, under the new claim
token (kept in ``P:child:<child run id>:claim``). The child run's record
carries the member's delegation depth and limit (``metadata["lattice_parent"]``),
so its lead delegates no deeper than a nested team's lead in one process
(:mod:`lattice_worker.team.depth`). When the child run ends,
:func:`reply_from_child` replies upstream and completes the work item."""

from __future__ import annotations

import logging
from typing import Any

from lattice_client.models import RunRecord, RunResult
from lattice_mailbox.base import ClaimError
from lattice_mailbox.message import MessageStatus, TeamMessage

from ...team.depth import DEPTH_METADATA_KEY, LIMIT_METADATA_KEY
from ...team.events import TeamAgentEvent, TeamMessageEvent
from ...team.ids import split_mailbox_id
from ...team.mailbox_state import MailboxToolState, set_message_status
from ...team.member import TeamMember
from ...team.team import Team
from ...team.work import WorkItemOutcome, member_depth, member_limit
from ..run.completion import complete_work_item, send_failure_report
from ..run.context import WorkerContext
from ..run.events import public_message
from ..run.keys import RUN_KEY_TTL_SECONDS
from ..run.trace import TRACE_CARRIER_KEY

logger = logging.getLogger("lattice_worker.runtime")


CHILD_CLAIM_SECONDS = 10 * 365 * 24 * 3600.0
"""How long (seconds) a nested team's message stays claimed once its child run
exists: in effect no expiry, the child run holds lead leases of its own."""


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
    upstream: dict[str, Any] = {
        "team": team.name,
        "member": member.name,
        "work_item_id": message.work_item_id,
        "claim_token": message.claim_token,
        "parent_team_run": run_id,
        # the child's lead runs at its member's delegation depth, under the limit there
        DEPTH_METADATA_KEY: member_depth(message),
    }
    limit = member_limit(team, message)
    if limit is not None:
        upstream[LIMIT_METADATA_KEY] = limit
    carrier = message.metadata.get(TRACE_CARRIER_KEY)
    if isinstance(carrier, dict):  # a traced parent run: the child run continues its trace
        upstream[TRACE_CARRIER_KEY] = carrier
    try:
        await ctx.runs.create(
            child_id,
            nested.name,
            message.content,
            metadata={"lattice_parent": upstream},
            parent={"run_id": run_id or "", "message_id": message.id, "mailbox_id": message.to},
        )
    except ValueError:
        existing = True
    if message.claim_token:
        client = await ctx.redis()
        await client.set(ctx.keys.child_claim(child_id), message.claim_token, ex=RUN_KEY_TTL_SECONDS)
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
        await ctx.events.emit(
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
    ctx.steps.run_lead(child_id, nested.name)
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
    token = await client.get(ctx.keys.child_claim(child.run_id)) or info.get("claim_token") or None
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
            await ctx.events.emit(run_id, event)

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
    await emit(
        TeamMessageEvent(subtype="failed", team=team.name, message=public_message(failed), error=failure)
    )
    return WorkItemOutcome(
        message=failed, status="failed", content=report.content, error=failure, report=report
    )


__all__ = ["CHILD_CLAIM_SECONDS", "child_run_id", "reply_from_child", "start_child_run"]
