"""The reaper: crash recovery for claimed messages and lost doorbells.

docs/architecture.md, "Crash"; issue 6 item 4. Every worker process runs one
reaper in a daemon thread with its own event loop (:meth:`Reaper.start`).
Only one reaper sweeps at a time across all workers of a deployment: a sweep
first takes ``<prefix>:reaper:lock``
(:class:`~lattice_worker.runtime.reaper_lock.ReaperLock`: held for half a
lease, renewed every third of that while the sweep runs, renewed and released
by its holder only); when it ends the lock is kept for the rest of one
interval, so the deployment sweeps about once per ``reaper_interval_seconds``
however many workers run. A holder killed mid-sweep delays the next sweep by
at most half a lease. A sweep that lost its lock (a renewal found another
holder, or the hold ran out since its last renewal) stops before its next
write (``SweepReport.lock_lost``); what it had already moved is followed up by
the next sweep (a requeued message's doorbell by the lost-doorbell scan, an
exhausted message's work item by the orphan repair).

A sweep:

1. ``requeue_expired(max_attempts=settings.max_attempts)`` moves every claim
   whose lease expired back to ``pending`` and rings that mailbox's doorbell;
   a message that used up its attempts moves to ``failed`` instead: a
   diagnostic goes upstream (``metadata["error"]["code"] == "max_attempts"``)
   and its work item completes as failed, so the waiting lead resumes.
2. Lost doorbells: for every member mailbox of the published teams whose oldest
   ``pending`` message has waited longer than one lease, the doorbell is rung
   again (at most once per lease per mailbox, marker ``<prefix>:reaper:rung:<mailbox>``).
   The scan pauses ``reaper_scan_pause_seconds`` after each member mailbox it
   reads (default 0), to spread a big deployment's sweep over time.
3. Stale resumes: a run of the :data:`STALE_SCAN_LIMIT` most recent ones that
   has been ``resuming`` for longer than one lease (its resume was to run in
   a worker that died) gets ``lattice.resume_lead`` again (at most once per
   lease, marker ``<prefix>:reaper:resumed:<run_id>``).
4. Expired lead leases: a run whose lead segment stopped renewing its lease
   (the worker died or stalled during a lead turn; the runs come from the
   lease index ``<prefix>:runs:leased``) becomes ``resuming`` with the recover
   flag and gets ``lattice.resume_lead``, which rebuilds it from the persisted
   history (:func:`lattice_worker.runtime.lead_recovery.recover_segment`); the stale
   worker's token stops holding the run, so its writes are refused. After
   ``max_attempts`` segment starts the run fails instead, with an error naming
   the attempts; its unfinished work is cancelled and a child run replies
   upstream with the failure.
5. Orphaned work items (on the runs of step 3's scan): a member step closes
   its task message (``done`` / ``failed``, fenced by its claim token), then
   sends its reply upstream, and only after its agent ends records the
   outcome in the run (``RunStore.complete_item``). A worker that dies in
   between leaves a terminal message (no lease: step 1 never sees it) and a
   ``suspended`` run waiting for the item forever. For every run of the :data:`STALE_SCAN_LIMIT`
   most recent ones that has been ``suspended`` for over a lease (looked at
   most once per half lease, marker ``<prefix>:reaper:orphans:<run_id>``),
   each unfinished item whose task message is terminal is noted (marker
   ``<prefix>:reaper:closed:<message_id>``; its age is read from its TTL, the
   Redis clock). Once the message has been seen terminal for over a lease
   (a live worker has had that long to record the item itself) its outcome is
   recorded through :func:`~lattice_worker.runtime.completion.complete_work_item`
   (doorbells and the resume follow), built as the member would have from the
   upstream message it sent for it (``reply_to`` = the task message: a reply,
   a failure report or a diagnostic). When there is none (the worker died
   between closing and sending) a ``diagnostic`` upstream message (code
   ``reply_lost``: "the worker running member X died after closing message
   M; its reply was lost") is sent first, guarded by
   ``<prefix>:reaper:lost:<message_id>``, and the item completes ``failed``
   with it, so the lead resumes with a failure report; a repeat after a crash
   finds that diagnostic instead of sending another. A ``cancelled`` message
   (an aborted member sends nothing upstream) completes ``cancelled``.
   ``complete_item`` is idempotent: a slow worker recording the same item
   later changes nothing (the first outcome stays).
   A task message left ``read`` (open) counts as closed too: its member sent
   only follow-ups (``team_followup``) and its run ended, which moves the
   claimed message to ``read``; the item completes ``open`` with the last
   follow-up, as the member would have. A ``read`` message that was never
   claimed (another run of the member opened it with ``team_read``) is
   repaired only while nothing of its mailbox is ``processing`` (a live run
   of the member may still answer it); without any upstream message for it,
   a ``reply_lost`` diagnostic fails it as above.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lattice_client.models import RunRecord
from lattice_client.registry import LiveRegistry, read_workers
from lattice_mailbox.message import MessageStatus, TeamMessage

from ..team.events import TeamMessageEvent
from ..team.ids import LEAD, split_mailbox_id
from ..team.work import WorkItemOutcome
from .completion import complete_work_item, send_failure_report
from .context import WorkerContext
from .reaper_lock import ReaperLock, ReaperLockLostError, lock_hold_seconds, lock_key
from .run_end import end_failed_run

logger = logging.getLogger("lattice_worker.runtime.reaper")

STALE_SCAN_LIMIT = 500
"""How many of the most recent runs the stale-resume check looks at per sweep."""


class _Unlocked:
    """The lock of a forced sweep (``lattice drain``, tests): none, always held."""

    async def __aenter__(self) -> _Unlocked:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        return None


Guard = ReaperLock | _Unlocked


@dataclass
class SweepReport:
    """What one sweep did: ``requeued`` / ``failed`` message ids (expired
    leases), ``rerung`` mailbox ids (lost doorbells), ``resumed`` run ids
    (stale resumes), ``recovered`` / ``failed_runs`` run ids (expired lead
    leases: re-enqueued / failed past ``max_attempts``), ``orphans`` work
    item ids completed for a member whose worker died after closing its
    message; ``lock_lost``: the sweep stopped early, its lock was lost."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rerung: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    lock_lost: bool = False


def rung_key(prefix: str, mailbox_id: str) -> str:
    """The marker of a recent lost-doorbell ring of ``mailbox_id``."""
    return f"{prefix}:reaper:rung:{mailbox_id}"


async def sweep(
    ctx: WorkerContext, *, interval_s: float | None = None, force: bool = False
) -> SweepReport | None:
    """One reaper sweep (see the module doc). Returns ``None`` when another
    reaper holds the lock (``force=True`` skips the lock: tests, ``lattice drain``).
    ``interval_s`` (seconds): how long the lock stays after the sweep (default
    the settings' reaper interval)."""
    keep_s = interval_s if interval_s is not None else ctx.settings.reaper_interval_seconds
    guard: Guard = _Unlocked()
    if not force:
        client = await ctx.redis()
        guard = ReaperLock(client, ctx.prefix, ctx.worker_id, lock_hold_seconds(ctx.settings.lease_seconds))
        if not await guard.acquire():
            return None
    report = SweepReport()
    try:
        async with guard:  # renewed while the sweep runs
            try:
                await _requeue(ctx, report, guard)
                await _lost_doorbells(ctx, report, guard)
                recent = await ctx.runs.list_runs(limit=STALE_SCAN_LIMIT)
                await _stale_resumes(ctx, report, recent, guard)
                await _expired_leads(ctx, report, guard)
                await _orphaned_items(ctx, report, recent, guard)
            except ReaperLockLostError:
                logger.warning("the reaper lock was lost mid-sweep; this sweep stops writing")
                report.lock_lost = True
            finally:
                await ctx.writer.flush()
        return report
    finally:
        if isinstance(guard, ReaperLock) and not report.lock_lost:
            try:
                await guard.release(keep_s)
            except Exception:
                logger.warning("could not release the reaper lock", exc_info=True)


async def _requeue(ctx: WorkerContext, report: SweepReport, guard: Guard) -> None:
    guard.check()
    moved = await ctx.mailbox.requeue_expired(max_attempts=ctx.settings.max_attempts)
    for message in moved:
        guard.check()
        if message.status == MessageStatus.PENDING:
            report.requeued.append(message.id)
            logger.warning(
                "lease of message %s in %s expired (attempt %d); requeued",
                message.id,
                message.to,
                message.attempts,
            )
            try:
                ctx.steps.ring(message.to)
            except ValueError:
                logger.warning("requeued message %s is in %r, not a team mailbox", message.id, message.to)
        elif message.status == MessageStatus.FAILED:
            report.failed.append(message.id)
            try:
                await fail_exhausted(ctx, message)
            except Exception:
                logger.exception("could not report the failure of message %s", message.id)


async def fail_exhausted(ctx: WorkerContext, message: TeamMessage) -> WorkItemOutcome:
    """``message`` failed after ``max_attempts`` expired claims: send the
    diagnostic upstream, emit ``team_message`` ``failed`` and complete its work
    item as failed (the lead resumes with the report)."""
    try:
        team_name, member = split_mailbox_id(message.to)
    except ValueError:
        team_name, member = "", message.to
    failure = {
        "code": "max_attempts",
        "message": (
            f"message {message.id} was claimed {message.attempts} time(s) and each claim's lease expired "
            f"(the worker died or stalled); max_attempts is {ctx.settings.max_attempts}"
        ),
        "error_type": None,
    }
    report = await send_failure_report(ctx.mailbox, message, member=member, team=team_name, failure=failure)
    failed = message.model_copy(update={"status": MessageStatus.FAILED, "claim_token": None})
    outcome = WorkItemOutcome(
        message=failed, status="failed", content=report.content, error=failure, report=report
    )
    link = await ctx.links.run_of(message.work_item_id)
    if link is not None:
        run_id, run_team = link
        await ctx.events.emit(
            run_id,
            TeamMessageEvent(subtype="failed", team=team_name, message=failed.to_json_dict(), error=failure),
        )
        await complete_work_item(ctx, run_id, run_team, message.work_item_id or "", outcome)
    return outcome


async def _published_teams(ctx: WorkerContext) -> set[str]:
    client = await ctx.redis()
    names = set(LiveRegistry(await read_workers(client, ctx.prefix)).team_names())
    names.update(ctx.registry.names())
    return names


async def _lost_doorbells(ctx: WorkerContext, report: SweepReport, guard: Guard) -> None:
    teams = await _published_teams(ctx)
    if not teams:
        return
    lease_ms = int(ctx.settings.lease_seconds * 1000)
    pause = ctx.settings.reaper_scan_pause_seconds
    client = await ctx.redis()
    for mailbox_id in await ctx.mailbox.mailbox_ids():
        now_ms = int(time.time() * 1000)
        try:
            team, member = split_mailbox_id(mailbox_id)
        except ValueError:
            continue
        if member == LEAD or team not in teams:
            continue
        if pause > 0:
            await asyncio.sleep(pause)
        oldest = await ctx.mailbox.inbox(mailbox_id, MessageStatus.PENDING, limit=1)
        if not oldest or oldest[0].created_at > now_ms - lease_ms:
            continue
        guard.check()
        if await client.set(rung_key(ctx.prefix, mailbox_id), "1", nx=True, px=lease_ms):
            logger.info(
                "mailbox %s has waited over a lease with nobody claiming; ringing its doorbell", mailbox_id
            )
            ctx.steps.ring(mailbox_id)
            report.rerung.append(mailbox_id)


async def _stale_resumes(
    ctx: WorkerContext, report: SweepReport, recent: list[RunRecord], guard: Guard
) -> None:
    lease_ms = int(ctx.settings.lease_seconds * 1000)
    now_ms = int(time.time() * 1000)
    client = await ctx.redis()
    for record in recent:
        if record.status.value != "resuming" or record.updated_at > now_ms - lease_ms:
            continue
        guard.check()
        if await client.set(f"{ctx.prefix}:reaper:resumed:{record.run_id}", "1", nx=True, px=lease_ms):
            logger.warning(
                "run %s has been resuming for over a lease; enqueueing its resume again", record.run_id
            )
            ctx.steps.resume(record.run_id, record.team)
            report.resumed.append(record.run_id)


async def _expired_leads(ctx: WorkerContext, report: SweepReport, guard: Guard) -> None:
    for run_id in await ctx.runs.expired_leads():
        guard.check()
        try:
            recovery = await ctx.runs.recover_lead(run_id, max_attempts=ctx.settings.max_attempts)
        except Exception:
            logger.exception("could not recover run %s", run_id)
            continue
        record = recovery.record
        if recovery.action == "requeued" and record is not None:
            logger.warning(
                "the lead lease of run %s expired (attempt %d); re-enqueueing it to recover",
                run_id,
                recovery.attempts,
            )
            ctx.steps.resume(run_id, record.team)
            report.recovered.append(run_id)
        elif recovery.action == "failed" and record is not None and recovery.result is not None:
            logger.error("run %s failed: %s", run_id, recovery.result.error)
            report.failed_runs.append(run_id)
            try:
                await end_failed_run(ctx, record, recovery.result)
            except Exception:
                logger.exception("could not clean up after the failure of run %s", run_id)


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


async def _orphaned_items(
    ctx: WorkerContext, report: SweepReport, recent: list[RunRecord], guard: Guard
) -> None:
    lease_ms = int(ctx.settings.lease_seconds * 1000)
    now_ms = int(time.time() * 1000)
    stale = [r for r in recent if r.status.value == "suspended" and r.updated_at <= now_ms - lease_ms]
    if not stale:
        return
    guard.check()
    client = await ctx.redis()
    # one round trip for the per-run guards, one for the open items of the runs taken
    async with client.pipeline(transaction=False) as pipe:
        for record in stale:
            pipe.set(orphan_scan_key(ctx.prefix, record.run_id), "1", nx=True, px=max(1, lease_ms // 2))
        taken = await pipe.execute()
    looked = [record for record, ok in zip(stale, taken, strict=True) if ok]
    if not looked:
        return
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
            await _repair_run(ctx, record.run_id, record.team, open_items, lease_ms, report, guard)
        except ReaperLockLostError:
            raise
        except Exception:
            logger.exception("could not check the work items of suspended run %s", record.run_id)


async def _repair_run(
    ctx: WorkerContext,
    run_id: str,
    team: str,
    open_items: list[dict[str, Any]],
    lease_ms: int,
    report: SweepReport,
    guard: Guard,
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
        report.orphans.append(work_item_id)


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


class Reaper:
    """A reaper thread: sweeps every ``interval_s`` seconds on its own event
    loop with its own :class:`WorkerContext` (from ``make_context``, called in
    the thread)."""

    def __init__(self, make_context: Callable[[], WorkerContext], *, interval_s: float) -> None:
        if not interval_s or interval_s <= 0:
            raise ValueError(f"Reaper: interval_s must be a positive number of seconds, got {interval_s!r}")
        self.make_context = make_context
        self.interval_s = float(interval_s)
        self.sweeps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        """Start the daemon thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="lattice-reaper", daemon=True)
            self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ctx: Any = None
        try:
            ctx = self.make_context()
            while not self._stop.is_set():
                try:
                    if loop.run_until_complete(sweep(ctx, interval_s=self.interval_s)) is not None:
                        self.sweeps += 1
                except Exception:
                    logger.warning("reaper sweep failed", exc_info=True)
                self._stop.wait(self.interval_s)
        finally:
            if ctx is not None:
                try:
                    loop.run_until_complete(ctx.aclose())
                except Exception:
                    pass
            loop.close()


__all__ = [
    "CLOSING_KINDS",
    "FOLLOWUP_KINDS",
    "Reaper",
    "SweepReport",
    "closed_key",
    "fail_exhausted",
    "lock_key",
    "orphan_outcome",
    "orphan_scan_key",
    "rung_key",
    "sweep",
]
