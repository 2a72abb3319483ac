"""Recovering a lead segment whose worker died: rebuild the run from what the
dead segment persisted (its history and its call journal)."""

from __future__ import annotations

import logging
from typing import Any

from lattice_client.errors import RunLeaseLostError, RunStateError
from lattice_client.models import RunRecord

from ...agent.agent import Agent
from ...team.team import Team
from ..run.context import WorkerContext
from .dispatch import dispatch_items, find_sent_message
from .lease import LeadLease
from .resume import mark_read, prepare_resume
from .session import spawn_lead

logger = logging.getLogger("lattice_worker.runtime")


async def recover_segment(
    ctx: WorkerContext, team: Team, record: RunRecord, lease: LeadLease
) -> tuple[Agent | None, Any]:
    """Rebuild a run whose previous segment died (its lease expired and the
    reaper re-enqueued it) from what that segment persisted.

    Returns ``(agent, prompt)`` for :func:`drive`, or ``(None, "suspended")``
    when the run suspended here. Cases, by the end of the persisted history:

    * empty: the segment died before storing the prompt -- start over with it;
    * an assistant message: the segment died inside that turn (during its tool
      batch, or before finishing). It is removed and *replayed*: the first
      model request returns it (:class:`~lattice_worker.runtime.lead.lease.ReplayModelClient`),
      so its tool batch runs again through the normal path; member calls it had
      sent are found in the call journal and not sent again (see
      :class:`RunLinkingMailbox`), the others are sent once. Items a
      previous resume had consumed but not cleared are cleared first;
    * a user message: member calls journaled but not registered (the segment
      died between the tool results and the registration) are registered now;
      then the run suspends while items are unfinished, or the finished items
      are applied (idempotently) and the loop continues.

    The lead's own tools in a replayed batch go through the segment's tool
    journal (:class:`~lattice_worker.runtime.lead.journal.LeadJournal`, read
    once here since the segment recovers): completed calls give their recorded
    results, an interrupted one is decided by its effect (``docs/tool-effects.md``).
    A run a person's decision resumes (``resolve_wait``) comes here too."""
    run_id = record.run_id
    await ctx.events.emit(
        run_id,
        {"type": "run_status", "status": "recovering", "run_id": run_id, "attempt": lease.attempts},
        fence=ctx.runs.lead_events_fence(run_id, lease.token),
    )
    logger.warning("run %s: recovering its lead (attempt %d) after a worker died", run_id, lease.attempts)
    probe = spawn_lead(ctx, team, run_id, lease=lease)
    history = await probe.get_history()
    if not history:
        return probe, record.prompt
    if history[-1].get("role") == "assistant":
        replay = history.pop()
        await _consume_finished_items(ctx, team, run_id, lease)
        await probe.replace_history(history)
        return spawn_lead(ctx, team, run_id, lease=lease, replay=replay), None
    journal = await ctx.runs.journal(run_id)
    if journal:
        items = await _journaled_items(ctx, history, journal)
        if items:
            await dispatch_items(ctx, run_id, team, items, lease=lease)
        else:
            await ctx.runs.clear_journal(run_id)
    await ctx.writer.sync(lease.token)
    try:
        suspended = await ctx.runs.suspend(run_id, token=lease.token)
    except RunStateError as exc:
        if exc.status == "cancelled":
            return None, "cancelled"
        raise RunLeaseLostError(run_id, "suspend") from None
    if suspended:
        await ctx.events.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
        return None, "suspended"
    await prepare_resume(ctx, team, run_id, probe, lease=lease)
    return probe, None


async def _consume_finished_items(ctx: WorkerContext, team: Team, run_id: str, lease: LeadLease) -> None:
    # The lead had been called again after its last resume, so whatever finished
    # items are still registered were already given to it (the crash came before
    # clear_items): close their reports and forget them, as prepare_resume would have.
    finished = [it for it in await ctx.runs.items(run_id) if it.get("outcome") is not None]
    if not finished:
        return
    for item in finished:
        report = (item.get("outcome") or {}).get("report") or {}
        if report.get("id"):
            await mark_read(team, str(report["id"]))
    await ctx.runs.clear_items(run_id, token=lease.token)


async def _journaled_items(
    ctx: WorkerContext, history: list[dict[str, Any]], journal: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The work items of the last tool batch's journaled member calls whose
    task message reached the mailbox, in tool-call order."""
    calls: list[str] = []
    for message in reversed(history):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                calls = [
                    str(b.get("id")) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
                ]
            break
    items = []
    for tool_use_id in calls:
        entry = journal.get(tool_use_id)
        if entry is None:
            continue
        message = await find_sent_message(ctx.mailbox, entry)
        if message is None:
            continue
        items.append(
            {
                "work_item_id": message.work_item_id,
                "message_id": message.id,
                "mailbox_id": message.to,
                "member": entry.get("member"),
                "mode": entry.get("mode"),
                "tool_use_id": tool_use_id,
            }
        )
    return items


__all__ = ["recover_segment"]
