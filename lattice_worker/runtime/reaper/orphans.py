"""The reaper's orphan repair: work items whose member's worker died after closing their message.

Step 5 of a sweep (:mod:`lattice_worker.runtime.reaper.sweep`), on the runs of its
stale-resume scan. A member step closes its task message (``done`` /
``failed``, fenced by its claim token), then sends its reply upstream, and only
after its agent ends records the outcome in the run
(``RunStore.complete_item``). A worker that dies in between leaves a terminal
message (no lease: the requeue never sees it) and a ``suspended`` run waiting
for the item forever. For every run that has been ``suspended`` for over a
lease (looked at most once per half lease, marker
``<prefix>:reaper:orphans:<run_id>``), each unfinished item whose task message
is terminal is noted (marker ``<prefix>:reaper:closed:<message_id>``; its age
is read from its TTL, the Redis clock). Once the message has been seen terminal
for over a lease (a live worker has had that long to record the item itself)
its outcome is recorded through
:func:`~lattice_worker.runtime.run.completion.complete_work_item` (doorbells and
the resume follow), built as the member would have from the upstream message
it sent for it (``reply_to`` = the task message: a reply, a failure report or a
diagnostic). When there is none (the worker died between closing and sending)
a ``diagnostic`` upstream message (code ``reply_lost``: "the worker running
member X died after closing message M; its reply was lost") is sent first,
guarded by ``<prefix>:reaper:lost:<message_id>``, and the item completes
``failed`` with it, so the lead resumes with a failure report; a repeat after a
crash finds that diagnostic instead of sending another. A ``cancelled`` message
(an aborted member sends nothing upstream) completes ``cancelled``.
``complete_item`` is idempotent: a slow worker recording the same item later
changes nothing (the first outcome stays).

A task message left ``read`` (open) counts as closed too: its member sent only
follow-ups (``team_followup``) and its run ended, which moves the claimed
message to ``read``; the item completes ``open`` with the last follow-up, as
the member would have. A ``read`` message that was never claimed (another run
of the member opened it with ``team_read``) is repaired only while nothing of
its mailbox is ``processing`` (a live run of the member may still answer it);
without any upstream message for it, a ``reply_lost`` diagnostic fails it as above.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from lattice_client.models import RunRecord
from lattice_mailbox.message import MessageStatus, TeamMessage

from ...team.events import TeamMessageEvent
from ...team.ids import split_mailbox_id
from ...team.work import WorkItemOutcome
from ..run.completion import complete_work_item, send_failure_report
from ..run.context import WorkerContext
from .lock import ReaperLockLostError, SweepGuard

logger = logging.getLogger("lattice_worker.runtime.reaper.sweep")


CLOSING_KINDS = frozenset({"reply", "failure", "diagnostic"})
"""``metadata["kind"]`` of the upstream messages that close a task message
(a follow-up leaves it open)."""

FOLLOWUP_KINDS = frozenset({"followup"})
"""``metadata["kind"]`` of the upstream messages that leave a task message open (``read``)."""


def orphan_scan_key(prefix: str, run_id: str) -> str:
    """The marker of a recent look at a suspended run's items (orphan check)."""
    return f"{prefix}:reaper:orphans:{run_id}"


def closed_key(prefix: str, message_id: str) -> str:
    """Since when (Redis clock, via its TTL) the reaper has seen the task message
    of an unfinished work item terminal (or ``read``)."""
    return f"{prefix}:reaper:closed:{message_id}"


async def repair_orphans(
    ctx: WorkerContext, recent: list[RunRecord], guard: SweepGuard, repaired: list[str]
) -> list[str]:
    """Step 5 of a sweep (see the module doc) on the runs ``recent``: appends
    the work item ids completed now to ``repaired`` (and returns it).
    ``guard.check()`` comes before every write (it raises
    :class:`~lattice_worker.runtime.reaper.lock.ReaperLockLostError` once the
    sweep lost its lock: what was repaired until then is in ``repaired``)."""
    lease_ms = int(ctx.settings.lease_seconds * 1000)
    now_ms = int(time.time() * 1000)
    stale = [r for r in recent if r.status.value == "suspended" and r.updated_at <= now_ms - lease_ms]
    if not stale:
        return repaired
    guard.check()
    client = await ctx.redis()
    # one round trip for the per-run guards, one for the open items of the runs taken
    async with client.pipeline(transaction=False) as pipe:
        for record in stale:
            pipe.set(orphan_scan_key(ctx.prefix, record.run_id), "1", nx=True, px=max(1, lease_ms // 2))
        taken = await pipe.execute()
    looked = [record for record, ok in zip(stale, taken, strict=True) if ok]
    if not looked:
        return repaired
    async with client.pipeline(transaction=False) as pipe:
        for record in looked:
            keys = ctx.runs.keys(record.run_id)
            pipe.hgetall(keys.state)
            pipe.hgetall(keys.items)
        replies = await pipe.execute()
    for index, record in enumerate(looked):
        states, items = replies[2 * index], replies[2 * index + 1]
        open_items = [json.loads(items[w]) for w, state in states.items() if state != "done" and w in items]
        if not open_items:
            continue
        try:
            await _repair_run(ctx, record.run_id, record.team, open_items, lease_ms, repaired, guard)
        except ReaperLockLostError:
            raise
        except Exception:
            logger.exception("could not check the work items of suspended run %s", record.run_id)
    return repaired


async def _repair_run(
    ctx: WorkerContext,
    run_id: str,
    team: str,
    open_items: list[dict[str, Any]],
    lease_ms: int,
    repaired: list[str],
    guard: SweepGuard,
) -> None:
    for item in open_items:
        message_id, work_item_id = str(item.get("message_id") or ""), str(item.get("work_item_id") or "")
        if not message_id or not work_item_id:
            continue
        message = await ctx.mailbox.get(message_id)
        if message is None or not (message.status.terminal or message.status == MessageStatus.READ):
            continue  # pending, claimed (its lease covers a crash: step 1), parked or unknown
        if message.status == MessageStatus.READ and not message.attempts and await _busy(ctx, message.to):
            continue  # opened by a run of the member that may still be alive and answer it
        guard.check()
        if not await _terminal_for_a_lease(ctx, message_id, lease_ms):
            continue  # maybe a live worker between closing it and completing the item
        guard.check()
        outcome = await orphan_outcome(ctx, message, lease_ms)
        if outcome is None:
            continue
        guard.check()
        logger.warning(
            "work item %s of run %s: its message %s is %s but the item never completed (the worker died); "
            "completing it %s",
            work_item_id,
            run_id,
            message_id,
            message.status.value,
            outcome.status,
        )
        await complete_work_item(ctx, run_id, team, work_item_id, outcome)
        repaired.append(work_item_id)


async def _busy(ctx: WorkerContext, mailbox_id: str) -> bool:
    """Whether a message of ``mailbox_id`` is ``processing`` (a member run holds a claim)."""
    return bool(await ctx.mailbox.inbox(mailbox_id, MessageStatus.PROCESSING, limit=1))


async def _terminal_for_a_lease(ctx: WorkerContext, message_id: str, lease_ms: int) -> bool:
    """Note that ``message_id`` is terminal (first sighting, Redis clock) and say
    whether the first sighting was over a lease ago."""
    client = await ctx.redis()
    key, hold = closed_key(ctx.prefix, message_id), 4 * max(1, lease_ms)
    async with client.pipeline(transaction=True) as pipe:
        pipe.set(key, hold, nx=True, px=hold)
        pipe.get(key)
        pipe.pttl(key)
        _, held, ttl = await pipe.execute()
    if held is None or int(ttl) < 0:
        return False
    return int(held) - int(ttl) >= lease_ms


async def _upstream_of(
    ctx: WorkerContext, message: TeamMessage, kinds: frozenset[str] = CLOSING_KINDS
) -> TeamMessage | None:
    """The last reply / failure report / diagnostic (``metadata["kind"]`` in
    ``kinds``) the member sent for ``message``, or ``None``. Unread ones are
    ``pending`` in the sender's mailbox (the lead marks them read only from an
    outcome); every status is searched after that."""
    for status in ("pending", "all"):
        found = [
            m
            for m in await ctx.mailbox.inbox(message.from_, status)
            if m.reply_to == message.id and m.from_ == message.to and m.metadata.get("kind") in kinds
        ]
        if found:
            return found[-1]
    return None


async def orphan_outcome(ctx: WorkerContext, message: TeamMessage, lease_ms: int) -> WorkItemOutcome | None:
    """The outcome of the terminal (or ``read``: left open) task ``message``
    whose worker died before recording it: built from the member's upstream
    message as the member would have (the last follow-up of a ``read`` one:
    status ``open``), else (the upstream message was lost) a ``reply_lost``
    diagnostic sent upstream now. ``None`` while another reaper is sending
    that diagnostic."""
    ended = message.model_copy(update={"claim_token": None})
    if message.status == MessageStatus.READ:  # left open: its member sent only follow-ups
        followup = await _upstream_of(ctx, message, FOLLOWUP_KINDS)
        if followup is not None:
            return WorkItemOutcome(
                message=ended,
                status="open",
                content=followup.content,
                structured_result=followup.metadata.get("structured_result"),
                report=followup,
            )
    upstream = await _upstream_of(ctx, message)
    if upstream is not None:
        meta = upstream.metadata
        status = meta.get("status") if meta.get("status") in ("done", "failed") else None
        if status is None:
            status = "done" if message.status == MessageStatus.DONE else message.status.value
        if status == "done":
            return WorkItemOutcome(
                message=ended,
                status="done",
                content=upstream.content,
                structured_result=meta.get("structured_result"),
                report=upstream,
            )
        return WorkItemOutcome(
            message=ended, status=status, content=upstream.content, error=meta.get("error"), report=upstream
        )
    try:
        team_name, member = split_mailbox_id(message.to)
    except ValueError:
        team_name, member = "", message.to
    if message.status == MessageStatus.CANCELLED:  # an aborted member sends nothing upstream
        failure = {
            "code": "aborted",
            "message": f"message {message.id} was cancelled; the worker running member {member} died "
            "before recording it",
            "error_type": "AbortError",
        }
        return WorkItemOutcome(message=ended, status="cancelled", content=failure["message"], error=failure)
    client = await ctx.redis()
    hold = 4 * max(1, lease_ms)
    if not await client.set(f"{ctx.prefix}:reaper:lost:{message.id}", "1", nx=True, px=hold):
        return None
    if message.status == MessageStatus.READ:
        text = (
            f"the worker running member {member} died with message {message.id} open (read); "
            "no reply or follow-up was sent for it"
        )
    else:
        what = "its reply" if message.status == MessageStatus.DONE else "its failure report"
        text = (
            f"the worker running member {member} died after closing message {message.id} "
            f"({message.status.value}); {what} was lost"
        )
    failure = {
        "code": "reply_lost",
        "message": text,
        "error_type": None,
    }
    report = await send_failure_report(
        ctx.mailbox, message, member=member, team=team_name, failure=failure, kind="diagnostic"
    )
    link = await ctx.links.run_of(message.work_item_id)
    if link is not None:
        await ctx.events.emit(
            link[0],
            TeamMessageEvent(subtype="failed", team=team_name, message=ended.to_json_dict(), error=failure),
        )
    return WorkItemOutcome(
        message=ended, status="failed", content=report.content, error=failure, report=report
    )


__all__ = [
    "CLOSING_KINDS",
    "FOLLOWUP_KINDS",
    "closed_key",
    "orphan_outcome",
    "orphan_scan_key",
    "repair_orphans",
]
