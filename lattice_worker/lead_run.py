"""The lead side of a distributed run: ``run_lead`` and ``resume_lead`` bodies.

DESIGN.md section 5, steps 2 and 4; issue 6 item 3. A lead turn runs in
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
run with ``parent``) replies upstream when it ends (:mod:`lattice_worker.member_run`).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from typing import Any

from lattice_client.errors import RunLeaseLostError, RunStateError
from lattice_client.models import RunRecord, RunResult, RunStatus
from lattice_client.runs import SegmentStart
from lattice_mailbox.message import MessageStatus, TeamMessage

from .agent.agent import Agent
from .agent.history_stores import RedisHistoryStore
from .agent.loop import SuspendQuery
from .errors import ConfigError
from .lead_lease import FencedHistoryStore, LeadLease, ReplayModelClient
from .team.lead_tools import make_lead_member_tools
from .team.member import TeamMember
from .team.member_tools import MailboxToolState, make_mailbox_tools
from .team.reports import failed_work_items, format_report_message, parse_report_message
from .team.team import Team
from .team.work import WorkItemOutcome, outcome_tool_text
from .tools.tool import ToolContext
from .worker_context import RUN_KEY_TTL_SECONDS, WorkerContext

logger = logging.getLogger("lattice_worker.runtime")

ASK_PLACEHOLDER = (
    "(lattice: member {member} is working on this ask as work item {work_item_id}; "
    "its answer replaces this text before your next turn)"
)
"""The ``ask`` tool result persisted while the member works; replaced on resume."""


_current_run: ContextVar[str | None] = ContextVar("lattice_current_run", default=None)
"""The run whose lead query is running in this task (set by :func:`drive`)."""

_current_lease: ContextVar[LeadLease | None] = ContextVar("lattice_current_lease", default=None)
"""The lead lease of the segment running in this task (set by :func:`drive`)."""


class RunLinkingMailbox:
    """The mailbox the lead's member tools send through: before a work item's
    message is sent (and so becomes claimable by any worker), the work item is
    linked to the current run (``<prefix>:workitem:<id>``) and the run id is
    added to the message metadata. Everything else is the wrapped store.

    Under a lead lease the call is first journaled by its ``tool_use_id``
    (``RunStore.journal_call``, refused once the lease is lost: a stale worker
    sends nothing). When the journal already holds the call -- a recovering
    segment replays the batch its dead predecessor started -- the message sent
    then is returned instead of a new one, or, if it never reached the mailbox,
    it is sent now under the journaled work item id: each member call is sent
    once."""

    def __init__(self, inner: Any, ctx: WorkerContext, team_name: str) -> None:
        self.inner = inner
        self.ctx = ctx
        self.team_name = team_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(
        self,
        from_: str,
        to: str,
        content: str,
        *,
        thread_id: str | None = None,
        work_item_id: str | None = None,
        reply_to: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> TeamMessage:
        run_id = _current_run.get()
        if run_id and work_item_id:
            lease = _current_lease.get()
            tool_use_id = (metadata or {}).get("tool_use_id")
            if lease is not None and lease.run_id == run_id and isinstance(tool_use_id, str) and tool_use_id:
                entry = {
                    "work_item_id": work_item_id,
                    "mailbox_id": to,
                    "member": (metadata or {}).get("member"),
                    "mode": (metadata or {}).get("mode"),
                    "tool_use_id": tool_use_id,
                }
                # the journal entry and the work item's link in one round trip
                journal, source = self.ctx.runs.journal_call_call(run_id, lease.token, tool_use_id, entry)
                link = self.ctx.link_command(run_id, self.team_name, work_item_id)
                replies = await self.ctx.write(
                    [journal, link], scripts=(source,), on_error=lease_error(lease, "journal_call")
                )
                earlier = self.ctx.runs.journal_reply(replies[0])
                linked = work_item_id
                if earlier is not None:
                    sent = await find_sent_message(self.inner, earlier)
                    if sent is not None:
                        logger.info(
                            "run %s: member call %s was sent before the recovery (message %s); not sent again",
                            run_id,
                            tool_use_id,
                            sent.id,
                        )
                        return sent
                    work_item_id = str(earlier.get("work_item_id") or work_item_id)
                if work_item_id != linked:
                    await self.ctx.link_work_items(run_id, self.team_name, [work_item_id])
            else:
                await self.ctx.link_work_items(run_id, self.team_name, [work_item_id])
            metadata = {**(metadata or {}), "run_id": run_id}
        return await self.inner.send(
            from_,
            to,
            content,
            thread_id=thread_id,
            work_item_id=work_item_id,
            reply_to=reply_to,
            metadata=metadata,
        )


def lease_error(lease: LeadLease, operation: str) -> Any:
    """An ``on_error`` for :meth:`WorkerContext.write` of the fenced script call
    ``operation``: a ``FENCED`` reply becomes :class:`RunLeaseLostError` and
    marks ``lease`` lost."""

    def mapped(exc: BaseException) -> BaseException:
        error = lease.runs.script_error(exc, lease.run_id, operation)
        if isinstance(error, RunLeaseLostError):
            lease.mark_lost()
        return error

    return mapped


async def find_sent_message(mailbox: Any, entry: dict[str, Any]) -> TeamMessage | None:
    """The task message of a journaled member call (``entry``: ``mailbox_id``,
    ``work_item_id``), or ``None`` when it never reached the mailbox. Reads the
    member mailbox (every status): only recovering segments call this."""
    mailbox_id, work_item_id = entry.get("mailbox_id"), entry.get("work_item_id")
    if not mailbox_id or not work_item_id:
        return None
    for message in await mailbox.inbox(str(mailbox_id), "all"):
        if message.work_item_id == work_item_id:
            return message
    return None


class _LeadTeamView:
    """The team as the lead's member tools see it: the same team, but sending
    through a :class:`RunLinkingMailbox`."""

    def __init__(self, team: Team, mailbox: RunLinkingMailbox) -> None:
        self._team = team
        self.mailbox = mailbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._team, name)


def _public(message: TeamMessage) -> dict[str, Any]:
    data = message.to_json_dict()
    data["claim_token"] = None
    return data


def _sent_event(team: str, message: TeamMessage) -> dict[str, Any]:
    """The ``team_message`` ``sent`` event of ``message`` as its wire dict
    (what ``TeamMessageEvent(subtype="sent", ...).model_dump()`` gives)."""
    return {
        "type": "team_message",
        "subtype": "sent",
        "team": team,
        "message": _public(message),
        "error": None,
    }


class DistributedLeadRuntime:
    """The lead query's ``runtime`` in a worker: the member tools' dispatcher
    (``ask`` / ``handoff`` register work items) and ``after_tool_batch``
    (register, ring doorbells, suspend)."""

    wants_stream_events = False
    """Run streams do not keep token-level ``stream_event`` events: the query
    does not produce them (the model request still streams)."""

    def __init__(
        self,
        ctx: WorkerContext,
        team: Team,
        run_id: str,
        lease: LeadLease | None = None,
        usage: dict[str, int] | None = None,
    ) -> None:
        self.ctx = ctx
        self.team = team
        self.run_id = run_id
        self.lease = lease
        self.usage = usage
        self.pending: list[dict[str, Any]] = []
        self.suspended: bool | None = None
        """Under a lease: whether the registration write also suspended the run
        (``None``: it did not try; see :meth:`after_tool_batch`)."""
        self.stopped: str | None = None
        """``"cancelled"`` when that suspension was refused because the run was
        cancelled meanwhile."""
        self.team_mailbox_state: MailboxToolState | None = None
        if team.expose_lead_mailbox_tools:
            self.team_mailbox_state = MailboxToolState(
                team_name=team.name,
                self_name="lead",
                member_names=[m.name for m in team.members],
                mailbox=team.mailbox,
                emit=self._emit,
            )

    async def _emit(self, event: Any) -> None:
        await self.ctx.emit(self.run_id, event)

    def _register(self, member: TeamMember, message: TeamMessage, mode: str, tool_use_id: str) -> None:
        self.pending.append(
            {
                "work_item_id": message.work_item_id,
                "message_id": message.id,
                "mailbox_id": message.to,
                "member": member.name,
                "mode": mode,
                "tool_use_id": tool_use_id,
            }
        )

    async def handoff(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> None:
        """Register an accepted handoff (it is dispatched after the tool batch)."""
        self._register(member, message, "handoff", ctx.tool_use_id)
        await self._emit(_sent_event(self.team.name, message))

    async def ask(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> str:
        """Register an ``ask``; returns the placeholder its answer replaces on resume."""
        self._register(member, message, "ask", ctx.tool_use_id)
        await self._emit(_sent_event(self.team.name, message))
        return ASK_PLACEHOLDER.format(member=member.name, work_item_id=message.work_item_id)

    async def after_tool_batch(self, outcome: Any) -> list[dict[str, Any]] | None:
        """Register this batch's work items (in tool-call order), ring the
        doorbells of those allowed to start, and suspend the query."""
        items, self.pending = self.pending, []
        if not items:
            return None
        order = {str(call.get("id")): i for i, call in enumerate(getattr(outcome, "calls", []) or [])}
        items.sort(key=lambda it: order.get(it["tool_use_id"], len(order)))
        lease = self.lease
        if lease is None or self.usage is None:
            await dispatch_items(self.ctx, self.run_id, self.team, items, lease=lease)
            raise SuspendQuery(f"waiting for {len(items)} member work item(s)")
        # Under a lease the query suspends right after this batch (no model
        # request in between): one round trip for the history, events, items
        # and suspension, in that order. The batch's usage is final; it is
        # queued once that fenced write succeeded (a segment that lost its
        # lease counts nothing) and goes with the context's next write.
        try:
            await dispatch_items(self.ctx, self.run_id, self.team, items, lease=lease, suspend=True)
            self.suspended = lease.ended  # else the wait set was empty: the lead goes on
        except RunStateError as exc:
            if isinstance(exc, RunLeaseLostError) or exc.status != "cancelled":
                raise RunLeaseLostError(self.run_id, "suspend") from None
            self.stopped = exc.status
        else:
            await self.ctx.add_usage(
                self.run_id,
                getattr(outcome, "usage", None),
                known=self.usage,
                fence=None if self.suspended else lease.token,
            )
        raise SuspendQuery(f"waiting for {len(items)} member work item(s)")


async def dispatch_items(
    ctx: WorkerContext,
    run_id: str,
    team: Team,
    items: list[dict[str, Any]],
    *,
    lease: LeadLease | None = None,
    suspend: bool = False,
) -> bool | None:
    """Add the batch's items to the run's wait set and ring the doorbells of
    the ones ``RunStore.add_items`` lets start now (their messages were linked
    to the run when they were sent, see :class:`RunLinkingMailbox`). Under a
    ``lease`` the registration is fenced by its token (``RunLeaseLostError``).

    ``suspend=True`` (with a ``lease``): the same round trip then suspends the
    run (``RunStore.suspend``; ``RunStateError`` when it had ended meanwhile)
    and the result says whether it is suspended now (``False``: its wait set
    was already empty, the lead goes on). Items a member finished before they
    were registered are then completed after the suspension, exactly as if
    the member had finished just after it (the last one enqueues the resume).
    Returns ``None`` without ``suspend``."""
    fence = lease.token if lease is not None else None
    call, source = ctx.runs.add_items_call(
        run_id, items, max_active=team.runner_options.max_concurrent_work_items, token=fence
    )
    ids = [it["work_item_id"] for it in items]
    # One round trip, in this order: the lead's queued events (they precede its
    # members' in the stream) and history (the tool results are stored before
    # the batch is registered), the registration, then the outcomes of items a
    # member finished before they were registered (their messages are claimable
    # from the moment they are sent; both sides write, then read) -- and, to
    # suspend, the suspension.
    commands: list[tuple[Any, ...]] = [call, ("mget", [ctx.early_outcome_key(w) for w in ids])]
    scripts: tuple[str, ...] = (source,)
    on_error: Any
    if lease is not None and suspend:
        suspend_call, suspend_source = ctx.runs.suspend_call(run_id, token=fence)
        commands.append(suspend_call)
        scripts = (source, suspend_source)
        on_error = _suspend_error(lease)
    elif lease is not None:
        on_error = lease_error(lease, "add_items")
    else:
        on_error = lambda exc: ctx.runs.script_error(exc, run_id, "add_items")  # noqa: E731
    replies = await ctx.write(commands, scripts=scripts, on_error=on_error)
    suspended: bool | None = None
    if len(replies) > 2:
        suspended = bool(replies[2])
        if suspended and lease is not None:
            lease.end()  # the suspension ended the segment (renewals stop quietly)
    await ctx.sync(fence)  # a failed history write of the batch is raised here
    for item in ctx.runs.add_items_reply(replies[0]):
        ctx.ring(item["mailbox_id"])
    early = {w: json.loads(r) for w, r in zip(ids, replies[1], strict=True) if r}
    for work_item_id, outcome in early.items():
        result = await ctx.runs.complete_item(run_id, work_item_id, outcome)
        from .member_run import apply_completion

        apply_completion(ctx, run_id, team.name, result)
    return suspended


def _suspend_error(lease: LeadLease) -> Any:
    """``on_error`` of a registration that also suspends: ``FENCED`` ->
    :class:`RunLeaseLostError` (the lease marked lost), ``BADSTATE`` ->
    :class:`RunStateError`."""

    def mapped(exc: BaseException) -> BaseException:
        error = lease.runs.suspend_error(exc, lease.run_id)
        if isinstance(error, RunLeaseLostError):
            lease.mark_lost()
        return error

    return mapped


def spawn_lead(
    ctx: WorkerContext,
    team: Team,
    run_id: str,
    *,
    lease: LeadLease | None = None,
    replay: dict[str, Any] | None = None,
    history: list[str] | None = None,
) -> Agent:
    """A fresh lead session for run ``run_id`` over its persisted history, with
    the member tools (and the mailbox tools when the team exposes them).

    ``lease``: the segment's lead lease; its history is then written only
    under it (:class:`~lattice_worker.lead_lease.FencedHistoryStore`, through
    ``ctx``'s writer: ``ctx.sync(lease.token)`` writes what it queued).
    ``replay``: a persisted assistant message the first model request returns
    instead of calling the model (a recovering segment finishing the turn its
    dead predecessor started). ``history``: the persisted history's elements
    when the caller already read them (with ``lease`` only; spares the
    session's first read). Raises :class:`ConfigError` when the team's lead is
    not an ``AgentSpec``."""
    spec = team.lead_spec
    if spec is None:
        raise ConfigError(
            f'team "{team.name}": the lead must be an AgentSpec (define_agent) to run distributed'
        )
    store: RedisHistoryStore
    if lease is not None:
        store = FencedHistoryStore(
            lease,
            ctx.client,
            ctx.history_key(run_id),
            ttl_seconds=RUN_KEY_TTL_SECONDS,
            history=history,
            writer=ctx,
        )
    else:
        store = RedisHistoryStore(
            ctx.client, ctx.history_key(run_id), fail_on_error=True, ttl_seconds=RUN_KEY_TTL_SECONDS
        )
    update: dict[str, Any] = {"history_store": store}
    if replay is not None:
        update["model_client"] = ReplayModelClient(
            replay, spec.options.model_client, api_key=spec.options.api_key, base_url=spec.options.base_url
        )
    options = spec.options.model_copy(update=update)
    agent = Agent(options, bare=options.workspace is False)
    tools = ctx.lead_tools.get(team.name)
    if tools is None:  # stateless (the dispatcher is the query's runtime): built once per team
        view = _LeadTeamView(team, RunLinkingMailbox(team.mailbox, ctx, team.name))
        tools = make_lead_member_tools(view)  # type: ignore[arg-type]
        if team.expose_lead_mailbox_tools:
            tools += make_mailbox_tools()
        ctx.lead_tools[team.name] = tools
    agent.add_tools(tools)
    return agent


def team_for_run(ctx: WorkerContext, record: RunRecord) -> Team:
    """The rebound team of a run record: by name, else by its reference
    (loaded on demand). Raises :class:`ConfigError` when this worker cannot serve it."""
    team = ctx.registry.get(record.team)
    if team is not None:
        return team
    if record.team_ref:
        loaded = ctx.registry.load(record.team_ref)
        if loaded.name == record.team:
            return loaded
    return ctx.registry.require(record.team)


async def run_lead(ctx: WorkerContext, run_id: str) -> str:
    """Body of ``lattice.run_lead``: start a ``queued`` run's lead.

    The segment holds a lead lease (:class:`~lattice_worker.lead_lease.LeadLease`)
    until it suspends or ends. Returns what happened: ``"missing"`` (no such
    run), ``"skipped"`` (not ``queued``: a duplicate or redelivered task, or a
    cancelled run), ``"suspended"``, ``"completed"``, ``"failed"``,
    ``"cancelled"``, ``"lost"`` (the lease was lost: another worker owns the run now)."""
    start = await _begin_segment(ctx, run_id, RunStatus.QUEUED)
    if start is None:
        record = await ctx.runs.get(run_id)
        if record is None:
            logger.warning("run_lead: no run %s (prefix %s)", run_id, ctx.prefix)
            return "missing"
        logger.info("run_lead: run %s is %s, not queued; nothing to do", run_id, record.status.value)
        return "skipped"
    if start.record is None:  # deleted meanwhile
        return "missing"
    lease = LeadLease(ctx.runs, run_id, start, ctx.settings.lease_seconds)
    try:
        return await _guarded(ctx, start.record, lease, resume=False, start=start)
    finally:
        await ctx.end_step()


async def _begin_segment(ctx: WorkerContext, run_id: str, expect: RunStatus) -> SegmentStart | None:
    # one round trip: the start, the run record, the lead's persisted history,
    # the run's token usage so far and (to resume) its work items -- through the
    # context's writer, with what an earlier step of this task left queued
    commands, source = ctx.runs.begin_segment_call(
        run_id,
        expect=expect,
        lease_s=ctx.settings.lease_seconds,
        read_record=True,
        history_key=ctx.history_key(run_id),
        read_items=expect == RunStatus.RESUMING,
        usage_key=ctx.usage_key(run_id),
    )
    replies = await ctx.write(commands, scripts=(source,))
    return ctx.runs.begin_segment_reply(commands, replies)


async def resume_lead(ctx: WorkerContext, run_id: str) -> str:
    """Body of ``lattice.resume_lead``: continue a run whose wait set emptied.

    ``"skipped"`` unless the run is ``resuming`` (exactly one resume per
    suspension; a cancelled run is never resumed); else like :func:`run_lead`.
    A run the reaper re-enqueued after its worker died (recover flag) is
    rebuilt from its persisted state first (:func:`recover_segment`)."""
    start = await _begin_segment(ctx, run_id, RunStatus.RESUMING)
    if start is None:
        logger.info("resume_lead: run %s is not resuming; nothing to do", run_id)
        return "skipped"
    if start.record is None:  # deleted meanwhile
        return "missing"
    lease = LeadLease(ctx.runs, run_id, start, ctx.settings.lease_seconds)
    try:
        return await _guarded(ctx, start.record, lease, resume=True, start=start)
    finally:
        await ctx.end_step()


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
            return await drive(ctx, team, record, agent, prompt, lease=lease, usage=usage)
    except RunLeaseLostError:
        return await _lost(ctx, record.run_id)
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
      model request returns it (:class:`~lattice_worker.lead_lease.ReplayModelClient`),
      so its tool batch runs again through the normal path; member calls it had
      sent are found in the call journal and not sent again (see
      :class:`RunLinkingMailbox`), the others are sent once. Items a
      previous resume had consumed but not cleared are cleared first;
    * a user message: member calls journaled but not registered (the segment
      died between the tool results and the registration) are registered now;
      then the run suspends while items are unfinished, or the finished items
      are applied (idempotently) and the loop continues.

    Tools other than member tools in a replayed batch run again (DESIGN.md
    section 6 effects and journals are not built yet)."""
    run_id = record.run_id
    await ctx.emit(
        run_id, {"type": "run_status", "status": "recovering", "run_id": run_id, "attempt": lease.attempts}
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
    await ctx.sync(lease.token)
    try:
        suspended = await ctx.runs.suspend(run_id, token=lease.token)
    except RunStateError as exc:
        if exc.status == "cancelled":
            return None, "cancelled"
        raise RunLeaseLostError(run_id, "suspend") from None
    if suspended:
        await ctx.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
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
            await _mark_read(team, str(report["id"]))
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


async def drive(
    ctx: WorkerContext,
    team: Team,
    record: RunRecord,
    agent: Agent,
    prompt: Any,
    *,
    lease: LeadLease | None = None,
    usage: dict[str, int] | None = None,
) -> str:
    """Run the lead's query until it suspends with work pending or ends.

    When the wait set is already empty at suspension (every item finished
    before the run could suspend), the run continues at once in this task.
    Under a ``lease`` every run-store write is fenced by its token and the
    query stops when the lease is lost (outcome ``"lost"``: nothing written).
    ``usage``: the run's token usage totals read when the segment started
    (kept up to date here; the segment's usage is then queued with its
    writes, see :meth:`WorkerContext.add_usage`)."""
    run_id = record.run_id
    ctx.note_parent(run_id, record.parent)
    fence = lease.token if lease is not None else None
    while True:
        if await _parent_gone(ctx, record):
            await cancel_run(ctx, run_id, "the parent run ended")
            return "cancelled"
        runtime = DistributedLeadRuntime(ctx, team, run_id, lease, usage if lease is not None else None)
        final: Any = None
        token = _current_run.set(run_id)
        lease_token = _current_lease.set(lease)
        options: dict[str, Any] = {"runtime": runtime}
        if lease is not None:
            options["signal"] = lease.controller.signal
        try:
            async for event in agent.query(prompt, **options):
                if getattr(event, "type", None) == "result":
                    final = event
                    if event.subtype != "suspended":
                        await ctx.emit(run_id, event)
                    continue
                await ctx.emit(run_id, event)
        finally:
            _current_lease.reset(lease_token)
            _current_run.reset(token)
        if runtime.stopped is not None:  # the run ended while the batch was registered
            logger.info("run %s not suspended (it is %s); stopping", run_id, runtime.stopped)
            return runtime.stopped
        if runtime.suspended:  # suspended with the batch's registration (its usage with it)
            ctx.queue_write([("zrem", ctx.runs.leases_key, run_id)])  # the segment ended; with the event
            await ctx.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
            return "suspended"
        if lease is not None and lease.lost:
            return await _lost(ctx, run_id)
        if final is None:  # pragma: no cover - the loop always ends with a result
            raise RuntimeError("the lead's query ended without a result")
        suspending = final.subtype == "suspended"
        if runtime.suspended is False:  # registered with its usage; the wait set was empty
            await prepare_resume(ctx, team, run_id, agent, lease=lease)
            prompt = None
            continue
        totals = await ctx.add_usage(run_id, final.usage, total=not suspending, known=usage, fence=fence)
        if suspending:
            await ctx.sync(fence)  # events and history, before a resume elsewhere adds its own
            try:
                suspended = await ctx.runs.suspend(run_id, token=fence, unindex_lease=fence is None)
            except RunStateError as exc:
                if isinstance(exc, RunLeaseLostError) or (lease is not None and exc.status != "cancelled"):
                    raise RunLeaseLostError(run_id, "suspend") from None
                logger.info("run %s not suspended (%s); stopping", run_id, exc)
                return exc.status if exc.status in ("cancelled", "completed", "failed") else "skipped"
            if suspended:
                if fence is not None:  # the segment ended: out of the lease index, with the event's write
                    ctx.queue_write([("zrem", ctx.runs.leases_key, run_id)])
                await ctx.emit(run_id, {"type": "run_status", "status": "suspended", "run_id": run_id})
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
        from .member_run import reply_from_child

        await reply_from_child(ctx, record, result)


async def _parent_gone(ctx: WorkerContext, record: RunRecord) -> bool:
    parent = record.parent
    if parent is None or not parent.run_id:
        return False
    parent_record = await ctx.runs.get(parent.run_id)
    return parent_record is None or parent_record.status.finished


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
        if outcome.report is not None:
            await _mark_read(team, outcome.report.id)
    if lease is None:
        await ctx.runs.clear_items(run_id)
        return
    # queued: written with the segment's next write (its next step, at the latest
    # its suspension or finish), fenced like the rest of the segment's writes
    call, source = ctx.runs.clear_items_call(run_id, token=lease.token)
    ctx.queue_write([call], scripts=(source,), fence=lease.token, on_error=lease_error(lease, "clear_items"))


def _already_reported(history: list[dict[str, Any]], reports: list[WorkItemOutcome]) -> bool:
    if not history:
        return False
    entries = parse_report_message(history[-1])
    reported = {e.get("work_item_id") for e in entries}
    return bool(entries) and all(r.message.work_item_id in reported for r in reports)


async def _mark_read(team: Team, message_id: str) -> None:
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
            await ctx.flush_events()  # the run_result event comes last
            written = await ctx.runs.finish(record.run_id, result)
        else:
            call, source = ctx.runs.finish_call(record.run_id, result, lease.token)
            replies = await ctx.write(
                [call, ("zrem", ctx.runs.leases_key, record.run_id)],
                scripts=(source,),
                on_error=lease_error(lease, "finish"),
            )
            written = bool(replies[0])
            try:
                await ctx.sync(lease.token)
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
        from .member_run import reply_from_child

        await reply_from_child(ctx, record, result)
    return written


__all__ = [
    "ASK_PLACEHOLDER",
    "RunLinkingMailbox",
    "cancel_run",
    "close_unread_reports",
    "end_failed_run",
    "find_sent_message",
    "recover_segment",
    "DistributedLeadRuntime",
    "ask_tool_result",
    "dispatch_items",
    "drive",
    "finish_run",
    "prepare_resume",
    "resume_lead",
    "run_lead",
    "spawn_lead",
    "team_for_run",
]
