"""The lead side of a distributed run: ``run_lead`` and ``resume_lead`` bodies.

docs/architecture.md, steps 2 and 4. A lead turn runs in
whichever worker took the task. Its conversation is persisted per run in Redis
(:class:`~lattice_worker.agent.history_stores.RedisHistoryStore`). A member
tool call sends the task message (the team's lead tools do that) and
registers a work item with :class:`DistributedLeadRuntime`, the lead query's
``runtime``. After the tool batch, ``after_tool_batch`` puts the batch's items
in the run's wait set (``RunStore.add_items``, bounded by the team's
``max_concurrent_work_items``) and suspends the run (``RunStore.suspend``) in
the same round trip, rings the doorbells of those allowed to start, and raises
``SuspendQuery``: the query ends with subtype ``"suspended"`` and the task
ends -- no worker waits on another. The worker completing the last item enqueues ``resume_lead``.

On resume the lead gets exactly what it gets in-process: the result of each
``ask`` call fills that call's ``tool_result`` (the lead tool returned a
placeholder, replaced in the persisted history), and the ``handoff`` reports
arrive as the next user message (``format_report_message``, handoff order).
Then the loop continues with ``Agent.query(None)``.

Guarantees: ``run_lead`` starts only from ``queued`` (a redelivered or
duplicated task is a no-op), ``resume_lead`` only once per suspension
(``RunStore.begin_resume``), a cancelled run is never resumed. Every SDK and
team event goes to the run's event stream; the final result goes to the run
record and the stream (``RunStore.finish``). A run of a nested team (a child
run with ``parent``) replies upstream when it ends (:mod:`lattice_worker.runtime.member.child_runs`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lattice_client.errors import RunLeaseLostError, RunStateError
from lattice_client.models import RunRecord, RunResult, RunStatus
from lattice_client.runstore import SegmentStart

from ...agent.agent import Agent
from ...agent.call_gate import current_call_gate
from ...errors import TeamNotServedError
from ...team.depth import delegated, delegation_limit, metadata_depth, metadata_limit
from ...team.reports import failed_work_items
from ...team.team import Team
from ..limits.hook import lead_scope, lead_waits
from ..run.budget import lead_gate, with_team_budget
from ..run.context import WorkerContext
from ..run.events import FenceSource, current_fence
from ..run.trace import RunTrace
from .dispatch import DistributedLeadRuntime, current_carrier, current_lease, current_run
from .end import cancel_run, finish_run
from .journal import LeadJournal
from .lease import LeadLease
from .recovery import recover_segment
from .resume import prepare_resume
from .session import spawn_lead, team_for_run

logger = logging.getLogger("lattice_worker.runtime")


async def run_lead(ctx: WorkerContext, run_id: str) -> str:
    """Body of ``lattice.run_lead``: start a ``queued`` run's lead.

    The segment holds a lead lease (:class:`~lattice_worker.runtime.lead.lease.LeadLease`)
    until it suspends or ends. Returns what happened: ``"missing"`` (no such
    run), ``"skipped"`` (not ``queued``: a duplicate or redelivered task, or a
    cancelled run), ``"suspended"``, ``"parked"`` / ``"awaiting_approval"``
    (suspended on a lead tool call that waits for a person), ``"budget_reached"``
    (parked on the run's token budget), ``"completed"``,
    ``"failed"``, ``"cancelled"``, ``"lost"`` (the lease was lost: another
    worker owns the run now), ``"refused"`` (the run names a team this worker
    does not serve: it fails with an error naming the team and the worker;
    nothing is imported)."""
    start, seen = await _begin_segment(ctx, run_id, RunStatus.QUEUED)
    if start is None:
        if seen is None:
            logger.warning("run_lead: no run %s (prefix %s)", run_id, ctx.prefix)
            return "missing"
        # (the status the refused start saw, not one read later: that may be "queued" again)
        logger.info("run_lead: run %s is %s, not queued; nothing to do", run_id, seen)
        return "skipped"
    if start.record is None:  # deleted meanwhile
        return "missing"
    lease = LeadLease(ctx.runs, run_id, start, ctx.settings.lease_seconds)
    try:
        return await _guarded(ctx, start.record, lease, resume=False, start=start)
    finally:
        await ctx.writer.flush()


async def _begin_segment(
    ctx: WorkerContext, run_id: str, expect: RunStatus
) -> tuple[SegmentStart | None, str | None]:
    # (the started segment or None, and when refused the status the run was in; None: missing)
    # one round trip: the start, the run record, the lead's persisted history,
    # the run's token usage so far and (to resume) its work items -- through the
    # context's writer, with what an earlier step of this task left queued
    commands, source = ctx.runs.begin_segment_call(
        run_id,
        expect=expect,
        lease_s=ctx.settings.lease_seconds,
        read_record=True,
        history_key=ctx.keys.history(run_id),
        read_items=expect == RunStatus.RESUMING,
        usage_key=ctx.keys.usage(run_id),
    )
    replies = await ctx.writer.write(commands, scripts=(source,))
    return ctx.runs.begin_segment_reply(commands, replies), ctx.runs.begin_segment_refusal(replies)


async def resume_lead(ctx: WorkerContext, run_id: str) -> str:
    """Body of ``lattice.resume_lead``: continue a run whose wait set emptied.

    ``"skipped"`` unless the run is ``resuming`` (exactly one resume per
    suspension; a cancelled run is never resumed); else like :func:`run_lead`.
    A run the reaper re-enqueued after its worker died (recover flag) is
    rebuilt from its persisted state first (:func:`recover_segment`)."""
    start, seen = await _begin_segment(ctx, run_id, RunStatus.RESUMING)
    if start is None:
        logger.info("resume_lead: run %s is %s, not resuming; nothing to do", run_id, seen or "missing")
        return "skipped"
    if start.record is None:  # deleted meanwhile
        return "missing"
    lease = LeadLease(ctx.runs, run_id, start, ctx.settings.lease_seconds)
    try:
        return await _guarded(ctx, start.record, lease, resume=True, start=start)
    finally:
        await ctx.writer.flush()


async def _guarded(
    ctx: WorkerContext,
    record: RunRecord,
    lease: LeadLease,
    *,
    resume: bool,
    start: SegmentStart | None = None,
) -> str:
    try:
        async with lease:
            team = team_for_run(ctx, record)
            if not resume:  # the team's default budget, for a run submitted without one
                record = await with_team_budget(ctx, team, record)
            # the record begin_segment read names the parent: the event needs no read of it
            ctx.events.note_parent(record.run_id, record.parent)
            await ctx.events.emit(
                record.run_id,
                {
                    "type": "lead_segment",
                    "run_id": record.run_id,
                    "worker": ctx.worker_id,
                    "attempt": lease.attempts,
                    "resume": resume,
                },
            )
            if lease.recover:
                agent, prompt = await recover_segment(ctx, team, record, lease)
                if agent is None:
                    return str(prompt)
            else:
                history = start.history if start is not None else None
                agent = spawn_lead(ctx, team, record.run_id, lease=lease, history=history)
                prompt = None if resume else record.prompt
                if resume:
                    items = start.items if start is not None else None
                    await prepare_resume(ctx, team, record.run_id, agent, lease=lease, items=items)
            usage = start.usage if start is not None else None
            trace = await RunTrace.begin(ctx, team, record, lease.token)  # None: untraced
            if trace is None:
                return await drive(ctx, team, record, agent, prompt, lease=lease, usage=usage)
            async with trace:  # ends the root (when this segment opened it) with the outcome
                trace.outcome = await drive(
                    ctx, team, record, agent, prompt, lease=lease, usage=usage, trace=trace
                )
            return trace.outcome
    except RunLeaseLostError:
        return await _lost(ctx, record.run_id)
    except TeamNotServedError as exc:
        logger.error("run %s refused: %s", record.run_id, exc)
        refused = RunResult(run_id=record.run_id, status="failed", error=str(exc))
        await finish_run(ctx, record, refused, lease=lease)
        return "refused"
    except Exception as exc:
        if lease.lost:
            return await _lost(ctx, record.run_id)
        logger.exception("run %s failed in the runtime", record.run_id)
        result = RunResult(
            run_id=record.run_id,
            status="failed",
            error=f"the runtime failed: {type(exc).__name__}: {exc}",
        )
        await finish_run(ctx, record, result, lease=lease)
        return "failed"


async def _lost(ctx: WorkerContext, run_id: str) -> str:
    """The outcome word of a segment whose lease was lost: ``"cancelled"``
    when the run was cancelled meanwhile, else ``"lost"`` (another worker took
    the run over, or it ended there)."""
    record = await ctx.runs.get(run_id)
    if record is not None and record.status == RunStatus.CANCELLED:
        return "cancelled"
    logger.warning("run %s: this worker's lead lease was lost; it stopped without writing more", run_id)
    return "lost"


async def drive(
    ctx: WorkerContext,
    team: Team,
    record: RunRecord,
    agent: Agent,
    prompt: Any,
    *,
    lease: LeadLease | None = None,
    usage: dict[str, int] | None = None,
    trace: RunTrace | None = None,
) -> str:
    """Run the lead's query until it suspends with work pending or ends.

    When the wait set is already empty at suspension (every item finished
    before the run could suspend), the run continues at once in this task.
    Under a ``lease`` every run-store write is fenced by its token and the
    query stops when the lease is lost (outcome ``"lost"``: nothing written).
    ``usage``: the run's token usage totals read when the segment started
    (kept up to date here; the segment's usage is then queued with its
    writes, see :meth:`~lattice_worker.runtime.run.usage.UsageCounter.add`).
    ``trace``: the run's trace in this segment (:mod:`~lattice_worker.runtime.run.trace`):
    each lead query is then traced under the run's root, and the member
    calls carry the root's carrier."""
    run_id = record.run_id
    ctx.events.note_parent(run_id, record.parent)
    fence = lease.token if lease is not None else None
    journal = LeadJournal(ctx, run_id, team.name, lease) if lease is not None else None
    while True:
        if await _parent_gone(ctx, record):
            await cancel_run(ctx, run_id, "the parent run ended")
            return "cancelled"
        runtime = DistributedLeadRuntime(
            ctx, team, run_id, lease, usage if lease is not None else None, journal=journal
        )
        final: Any = None
        token = current_run.set(run_id)
        lease_token = current_lease.set(lease)
        fence_token = current_fence.set(_events_fence(ctx, run_id, lease))
        options: dict[str, Any] = {"runtime": runtime}
        if lease is not None:
            options["signal"] = lease.controller.signal
        if trace is not None:
            options.update(trace.lead_options(team, agent))
        carrier_token = current_carrier.set(trace.carrier if trace is not None else None)
        gate = lead_gate(ctx, record, lease)  # None: the run has no budget
        gate_token = current_call_gate.set(gate)
        try:
            with lead_delegation(team, record), lead_scope(ctx, run_id, lease) as calls:
                async for event in agent.query(prompt, **options):
                    if getattr(event, "type", None) == "result":
                        final = event
                        if event.subtype != "suspended":
                            await ctx.events.emit(run_id, event)
                        continue
                    await ctx.events.emit(run_id, event)
        finally:
            current_call_gate.reset(gate_token)
            current_carrier.reset(carrier_token)
            current_fence.reset(fence_token)
            current_lease.reset(lease_token)
            current_run.reset(token)
        if trace is not None:
            trace.final = final
        if calls.wait is not None and lease is not None and getattr(final, "subtype", None) == "suspended":
            # a model call waits for its turn: the segment ends, no worker waits
            return await lead_waits(ctx, team.name, run_id, lease, calls.wait, final, usage)
        if journal is not None and journal.waiting is not None:  # suspended on a call that waits for a person
            return await _parked(ctx, run_id, journal.waiting, final, usage)
        if runtime.stopped is not None:  # the run ended while the batch was registered
            logger.info("run %s not suspended (it is %s); stopping", run_id, runtime.stopped)
            return runtime.stopped
        if runtime.suspended:  # suspended with the batch's registration (its usage with it)
            ctx.writer.queue_write(
                [("zrem", ctx.runs.leases_key, run_id)]
            )  # the segment ended; with the event
            await ctx.events.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
            return "suspended"
        if lease is not None and lease.lost:
            return await _lost(ctx, run_id)
        if final is None:  # pragma: no cover - the loop always ends with a result
            raise RuntimeError("the lead's query ended without a result")
        if (
            gate is not None
            and gate.stopped is not None
            and final.subtype == "suspended"
            and runtime.suspended is None
        ):
            parked = await gate.park_segment(final, usage)  # the budget is spent: no worker waits
            if parked is not None:
                return parked
            prompt = None  # raised meanwhile: the lead goes on
            continue
        suspending = final.subtype == "suspended"
        if runtime.suspended is False:  # registered with its usage; the wait set was empty
            await prepare_resume(ctx, team, run_id, agent, lease=lease)
            prompt = None
            continue
        totals = await ctx.usage.add(run_id, final.usage, total=not suspending, known=usage, fence=fence)
        if suspending:
            await ctx.writer.sync(fence)  # events and history, before a resume elsewhere adds its own
            try:
                suspended = await ctx.runs.suspend(run_id, token=fence, unindex_lease=fence is None)
            except RunStateError as exc:
                if isinstance(exc, RunLeaseLostError) or (lease is not None and exc.status != "cancelled"):
                    raise RunLeaseLostError(run_id, "suspend") from None
                logger.info("run %s not suspended (%s); stopping", run_id, exc)
                return exc.status if exc.status in ("cancelled", "completed", "failed") else "skipped"
            if suspended:
                if fence is not None:  # the segment ended: out of the lease index, with the event's write
                    ctx.writer.queue_write([("zrem", ctx.runs.leases_key, run_id)])
                await ctx.events.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
                return "suspended"
            await prepare_resume(ctx, team, run_id, agent, lease=lease)
            prompt = None
            continue
        status = "failed" if final.is_error else "completed"
        result = RunResult(
            run_id=run_id,
            status=status,
            result=final.result if status == "completed" else (final.result or None),
            structured_result=final.structured_result,
            error=final.error if final.is_error else None,
            usage=totals,
            failed_work_items=failed_work_items(await agent.get_history()),
        )
        if not await finish_run(ctx, record, result, lease=lease) and lease is not None and lease.lost:
            return await _lost(ctx, run_id)
        return status


@contextmanager
def lead_delegation(team: Team, record: RunRecord) -> Iterator[None]:
    """The delegation depth and limit the lead of ``record`` runs under, as in
    one process: depth 0 under the team's ``max_delegate_depth`` for a run a
    client submitted; for a nested team's child run, the depth and limit of
    the member it serves (``metadata["lattice_parent"]``, written by
    :func:`~lattice_worker.runtime.member.child_runs.start_child_run`) as well."""
    depth: int | None = None
    limit: int | None = None
    upstream = record.metadata.get("lattice_parent") if record.parent is not None else None
    if isinstance(upstream, dict):
        depth, limit = metadata_depth(upstream), metadata_limit(upstream)
    with (
        delegated(depth or 0),
        delegation_limit(limit),
        delegation_limit(team.runner_options.max_delegate_depth),
    ):
        yield


def _events_fence(ctx: WorkerContext, run_id: str, lease: LeadLease | None) -> FenceSource | None:
    """The fence of the segment's events: its lease, until the segment ends its
    hold itself (a suspension or a parked call: what it emits then is not fenced)."""
    if lease is None:
        return None
    fence = ctx.runs.lead_events_fence(run_id, lease.token)
    return lambda: None if lease.ended else fence


async def _parked(
    ctx: WorkerContext, run_id: str, wait: dict[str, Any], final: Any, usage: dict[str, int] | None
) -> str:
    """The segment ended with the run suspended on ``wait`` (``park_lead``
    wrote it; the lease is gone): count its usage, tell the stream, and say so."""
    await ctx.usage.add(run_id, getattr(final, "usage", None), known=usage, fence=None)
    kind = "parked" if wait["kind"] == "parked" else "awaiting_approval"
    await ctx.events.emit(
        run_id, {"type": "run_status", "status": kind, "run_id": run_id, "wait_id": wait["id"]}
    )
    return kind


async def _parent_gone(ctx: WorkerContext, record: RunRecord) -> bool:
    parent = record.parent
    if parent is None or not parent.run_id:
        return False
    parent_record = await ctx.runs.get(parent.run_id)
    return parent_record is None or parent_record.status.finished


__all__ = ["drive", "lead_delegation", "resume_lead", "run_lead"]
