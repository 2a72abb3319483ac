"""The end of a run: the final result (and a child run's reply upstream),
cancellation as the client does it, the clean-up after the reaper failed a run."""

from __future__ import annotations

import logging

from lattice_client.errors import RunLeaseLostError
from lattice_client.models import RunRecord, RunResult, RunStatus
from lattice_mailbox.message import MessageStatus

from ..member.child_runs import reply_from_child
from ..run.completion import close_unread_reports
from ..run.context import WorkerContext
from .dispatch import find_sent_message, lease_error
from .lease import LeadLease

logger = logging.getLogger("lattice_worker.runtime")


async def cancel_run(ctx: WorkerContext, run_id: str, reason: str) -> list[str]:
    """Cancel a run as the client does: the run record, then the mailbox message
    of every unfinished work item (those already finished are left alone), then
    the replies to the lead its lead will never read (:func:`close_unread_reports`).
    Returns the ids of the messages moved to ``cancelled``."""
    cancelled = []
    for item in await ctx.runs.cancel(run_id, reason=reason):
        message_id = str(item.get("message_id"))
        try:
            if await ctx.mailbox.update_status(message_id, MessageStatus.CANCELLED):
                cancelled.append(message_id)
        except ValueError:  # already finished
            continue
    record = await ctx.runs.get(run_id)
    if record is not None and record.status == RunStatus.CANCELLED:
        unread = await ctx.runs.unread_reports(run_id) + await _journaled_messages(ctx, run_id)
        cancelled += await close_unread_reports(ctx.mailbox, unread)
    return cancelled


async def _journaled_messages(ctx: WorkerContext, run_id: str) -> list[str]:
    """Ids of the task messages a lead batch in progress sent but had not registered."""
    ids = []
    for entry in (await ctx.runs.journal(run_id)).values():
        sent = await find_sent_message(ctx.mailbox, entry)
        if sent is not None:
            ids.append(sent.id)
    return ids


async def end_failed_run(ctx: WorkerContext, record: RunRecord, result: RunResult) -> None:
    """Clean up after the reaper failed a run whose lead kept dying: cancel the
    messages of its unfinished work items (registered, or sent by the batch in
    progress), close the replies its lead will not read, and -- for a child
    run -- reply upstream with the failure."""
    message_ids = [
        str(it.get("message_id")) for it in await ctx.runs.items(record.run_id) if it.get("state") != "done"
    ]
    message_ids += await _journaled_messages(ctx, record.run_id)  # sent, not registered yet
    for message_id in message_ids:
        try:
            message = await ctx.mailbox.get(message_id)
            if message is not None and not message.status.terminal:
                await ctx.mailbox.update_status(message_id, MessageStatus.CANCELLED)
        except (ValueError, LookupError):
            continue
    await close_unread_reports(ctx.mailbox, await ctx.runs.unread_reports(record.run_id))
    if record.parent is not None:
        await reply_from_child(ctx, record, result)


async def finish_run(
    ctx: WorkerContext, record: RunRecord, result: RunResult, *, lease: LeadLease | None = None
) -> bool:
    """Write the final result (record + ``run_result`` event); a child run then
    replies upstream. Returns False when the run had already finished or was
    cancelled, or when ``lease`` no longer holds it (nothing written, no reply).
    Under a ``lease``, the segment's queued writes (events, history, usage),
    the result and the lease-index removal go in one round trip, in that order."""
    try:
        if lease is None:
            await ctx.writer.flush()  # the run_result event comes last
            written = await ctx.runs.finish(record.run_id, result)
        else:
            call, source = ctx.runs.finish_call(record.run_id, result, lease.token)
            replies = await ctx.writer.write(
                [call, ("zrem", ctx.runs.leases_key, record.run_id)],
                scripts=(source,),
                on_error=lease_error(lease, "finish"),
            )
            written = bool(replies[0])
            try:
                await ctx.writer.sync(lease.token)
            except Exception:  # the result is written; a queued write before it failed
                logger.warning("run %s: a write before the result failed", record.run_id, exc_info=True)
    except RunLeaseLostError:
        if lease is not None:
            lease.mark_lost()
            await ctx.runs.reindex_lease(record.run_id)  # the entry is the holder's
        logger.warning("run %s: lead lease lost; the result of this worker is discarded", record.run_id)
        return False
    except Exception:
        logger.exception("could not finish run %s", record.run_id)
        return False
    if written and record.parent is not None:
        await reply_from_child(ctx, record, result)
    return written


__all__ = ["cancel_run", "end_failed_run", "finish_run"]
