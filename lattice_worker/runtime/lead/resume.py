"""Resuming a lead: its finished work items become what it gets in-process --
``ask`` answers in their ``tool_result`` blocks, ``handoff`` reports as the
next user message (handoff order)."""

from __future__ import annotations

import logging
from typing import Any

from lattice_mailbox.message import MessageStatus
from lattice_mailbox.redis import RedisMailbox

from ...agent.agent import Agent
from ...team.reports import format_report_message, parse_report_message
from ...team.team import Team
from ...team.work import WorkItemOutcome, outcome_tool_text
from ..run.context import WorkerContext
from .dispatch import lease_error
from .lease import LeadLease

logger = logging.getLogger("lattice_worker.runtime")


async def prepare_resume(
    ctx: WorkerContext,
    team: Team,
    run_id: str,
    agent: Agent,
    *,
    lease: LeadLease | None = None,
    items: list[dict[str, Any]] | None = None,
) -> None:
    """Give the lead its finished work items: ``ask`` answers replace their
    placeholders in the persisted history, ``handoff`` reports are appended as
    the next user message (handoff order); then the upstream report messages
    are marked ``done`` (the lead has read them) and the items cleared.

    Idempotent, so a recovering segment may run it again after a crash in the
    middle: a report message already at the end of the history for the same
    work items is not appended twice (ask results are replaced in place).
    ``items``: the run's items (``RunStore.items``) when the caller read them
    since the wait set emptied (the segment start does)."""
    if items is None:
        items = await ctx.runs.items(run_id)
    items = [it for it in items if it.get("outcome") is not None]
    history = await agent.get_history()
    asks: dict[str, WorkItemOutcome] = {}
    reports: list[WorkItemOutcome] = []
    for item in items:
        outcome = WorkItemOutcome.from_dict(item["outcome"])
        if item.get("mode") == "ask" and item.get("tool_use_id"):
            asks[str(item["tool_use_id"])] = outcome
        else:
            reports.append(outcome)
    if asks:
        _fill_asks(history, asks)
    report = None
    if reports and not _already_reported(history, reports):
        report = format_report_message(reports)
    if asks:
        if report is not None:
            history.append(report)
        await agent.replace_history(history)
    elif report is not None:  # only appended: the stored messages stay as they are
        await agent._append(report)
    for outcome in [*asks.values(), *reports]:
        if outcome.report is not None and not _queue_mark_read(ctx, team, outcome.report.id, lease):
            await mark_read(team, outcome.report.id)
    if lease is None:
        await ctx.runs.clear_items(run_id)
        return
    # queued: written with the segment's next write (its next step, at the latest
    # its suspension or finish), fenced like the rest of the segment's writes
    call, source = ctx.runs.clear_items_call(run_id, token=lease.token)
    ctx.writer.queue_write(
        [call], scripts=(source,), fence=lease.token, on_error=lease_error(lease, "clear_items")
    )


def _already_reported(history: list[dict[str, Any]], reports: list[WorkItemOutcome]) -> bool:
    if not history:
        return False
    entries = parse_report_message(history[-1])
    reported = {e.get("work_item_id") for e in entries}
    return bool(entries) and all(r.message.work_item_id in reported for r in reports)


def _queue_mark_read(ctx: WorkerContext, team: Team, message_id: str, lease: LeadLease | None) -> bool:
    """:func:`mark_read` queued on the segment's writer (written with its next write,
    after the history it was read into), when the team's mailbox is a
    :class:`~lattice_mailbox.redis.RedisMailbox` on the writer's server: one round
    trip fewer per resume. ``False`` when it cannot be (the caller marks it itself)."""
    mailbox = team.mailbox
    if lease is None or not isinstance(mailbox, RedisMailbox) or mailbox.url != ctx.writer.redis_url:
        return False
    call = mailbox.update_status_call(message_id, MessageStatus.DONE)
    if call is not None:  # (None: no message of this store; update_status would answer False)
        command, source = call
        ctx.writer.queue_write([command], scripts=(source,))
    return True


async def mark_read(team: Team, message_id: str) -> None:
    try:
        await team.mailbox.update_status(message_id, MessageStatus.DONE)
    except Exception:  # consumed or moved by someone else already
        pass


def ask_tool_result(tool_use_id: str, outcome: WorkItemOutcome) -> dict[str, Any]:
    """The ``tool_result`` block an ``ask`` gets in-process for ``outcome``:
    the answer text (structured result as JSON), a progress note for an open
    item, or an ``"Error: ..."`` result for a failed / cancelled one."""
    if outcome.status in ("failed", "cancelled"):
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": f"Error: {outcome.content}",
            "is_error": True,
        }
    if outcome.status == "open":
        text = f"(progress only; the work item stays open) {outcome.content}"
    else:
        text = outcome_tool_text(outcome)
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}


def _fill_asks(history: list[dict[str, Any]], asks: dict[str, WorkItemOutcome]) -> None:
    remaining = dict(asks)
    for message in reversed(history):
        if not remaining:
            return
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        blocks = message["content"]
        for i, block in enumerate(blocks):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                tool_use_id = str(block.get("tool_use_id"))
                outcome = remaining.pop(tool_use_id, None)
                if outcome is not None:
                    blocks[i] = ask_tool_result(tool_use_id, outcome)
    if remaining:
        logger.warning("ask results without a tool_result in history: %s", ", ".join(remaining))


__all__ = ["ask_tool_result", "mark_read", "prepare_resume"]
