"""The reaper: crash recovery for claimed messages and lost doorbells.

docs/architecture.md, "Crash". Every worker process runs one
reaper in a daemon thread with its own event loop (:meth:`Reaper.start`).
Only one reaper sweeps at a time across all workers of a deployment: a sweep
first takes ``<prefix>:reaper:lock``
(:class:`~lattice_worker.runtime.reaper.lock.ReaperLock`: held for half a
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
   whose lease expired back to ``pending`` and rings that mailbox's doorbell
   (a run's work item first gets the expired claim revoked,
   :func:`revoke_claim`: a stalled worker that still holds it writes nothing more);
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
   history (:func:`lattice_worker.runtime.lead.recovery.recover_segment`); the stale
   worker's token stops holding the run, so its writes are refused. After
   ``max_attempts`` segment starts the run fails instead, with an error naming
   the attempts; its unfinished work is cancelled and a child run replies
   upstream with the failure.
5. Orphaned work items (on the runs of step 3's scan): a ``suspended`` run's
   unfinished item whose task message was closed (or left ``read`` after a
   follow-up) by a member whose worker then died is completed from the
   member's upstream message, or failed with a ``reply_lost`` diagnostic
   (:mod:`lattice_worker.runtime.reaper.orphans`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lattice_client.models import RunRecord
from lattice_client.registry import LiveRegistry, read_workers
from lattice_mailbox.message import MessageStatus, TeamMessage

from ...team.events import TeamMessageEvent
from ...team.ids import LEAD, split_mailbox_id
from ...team.work import WorkItemOutcome
from ..lead.end import end_failed_run
from ..run.completion import complete_work_item, send_failure_report
from ..run.context import WorkerContext
from .lock import NoLock, ReaperLock, ReaperLockLostError, SweepGuard, lock_hold_seconds, lock_key
from .orphans import (
    CLOSING_KINDS,
    FOLLOWUP_KINDS,
    closed_key,
    orphan_outcome,
    orphan_scan_key,
    repair_orphans,
)

logger = logging.getLogger("lattice_worker.runtime.reaper.sweep")

STALE_SCAN_LIMIT = 500
"""How many of the most recent runs the stale-resume check looks at per sweep."""


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
    guard: SweepGuard = NoLock()
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
                await repair_orphans(ctx, recent, guard, report.orphans)
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


async def _requeue(ctx: WorkerContext, report: SweepReport, guard: SweepGuard) -> None:
    guard.check()
    moved = await ctx.mailbox.requeue_expired(max_attempts=ctx.settings.max_attempts)
    for message in moved:
        guard.check()
        await revoke_claim(ctx, message)
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


async def revoke_claim(ctx: WorkerContext, message: TeamMessage) -> None:
    """The claim on ``message`` expired (requeued or failed just now): when it
    is a run's work item, that claim's item writes and run events stop
    (``RunStore.revoke_item_claim``), before a later claim begins. Failures
    are logged (the next claim's own writes take the item over anyway)."""
    run_id = message.metadata.get("run_id")
    if not isinstance(run_id, str) or not run_id or not message.work_item_id:
        return
    try:
        await ctx.runs.revoke_item_claim(run_id, message.work_item_id, message.attempts)
    except Exception:
        logger.warning("could not revoke the expired claim on message %s", message.id, exc_info=True)


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
            f"message {message.id}'s claim expired {ctx.settings.max_attempts} time(s) (the worker died "
            f"or stalled; max_attempts is {ctx.settings.max_attempts}); it was claimed {message.attempts} time(s)"
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


async def _lost_doorbells(ctx: WorkerContext, report: SweepReport, guard: SweepGuard) -> None:
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
    ctx: WorkerContext, report: SweepReport, recent: list[RunRecord], guard: SweepGuard
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


async def _expired_leads(ctx: WorkerContext, report: SweepReport, guard: SweepGuard) -> None:
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
    "revoke_claim",
    "rung_key",
    "sweep",
]
