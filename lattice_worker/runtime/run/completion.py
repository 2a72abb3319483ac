"""Completing a work item: record its outcome in the run, ring the doorbells of
the items that may start now, enqueue the resume; the failure reports a
member's failure becomes upstream; closing the replies a finished run never reads.

Used by the member step, child runs, the lead's registration (items finished
before they were registered) and the reaper (orphans, exhausted claims)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_mailbox.message import MessageStatus, TeamMessage

from ...team.work import WorkItemOutcome
from .context import WorkerContext

logger = logging.getLogger("lattice_worker.runtime")


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
        await ctx.links.save_early_outcome(work_item_id, data)
        result = await _complete_item(ctx, run_id, work_item_id, data)
    apply_completion(ctx, run_id, team_name, result)
    if outcome.report is not None and result.run_status in ("completed", "failed", "cancelled"):
        await close_unread_reports(ctx.mailbox, [outcome.report.id])


def apply_completion(ctx: WorkerContext, run_id: str, team_name: str, result: Any) -> None:
    """Act on a ``CompleteResult``: ring the doorbells of the items it lets start
    and enqueue ``resume_lead`` when it emptied a suspended run's wait set."""
    for item in result.dispatch:
        ctx.steps.ring(item["mailbox_id"], item.get("message_id"))
    if result.resume:
        ctx.steps.resume(run_id, team_name)


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
            (reply,) = await ctx.writer.write(
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


async def close_unread_reports(mailbox: Any, message_ids: list[str]) -> list[str]:
    """Move the given messages (replies and failure reports to a lead, task
    messages nobody registered) that are not finished to ``cancelled``: their
    run ended without anyone reading them. Returns the ids moved; finished
    ones are left as they are."""
    closed = []
    for message_id in message_ids:
        try:
            message = await mailbox.get(message_id)
            if message is None or message.status.terminal:
                continue
            if await mailbox.update_status(message_id, MessageStatus.CANCELLED):
                closed.append(message_id)
        except ValueError:  # finished meanwhile
            continue
    return closed


__all__ = ["apply_completion", "close_unread_reports", "complete_work_item", "send_failure_report"]
