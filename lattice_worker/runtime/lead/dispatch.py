"""A lead's tool batch: member calls sent through a run-linking (and, under a
lead lease, journaling) mailbox, registered after the batch with the
suspension in the same round trip (:class:`DistributedLeadRuntime`, the lead
query's ``runtime``; :func:`dispatch_items`)."""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from typing import Any

from lattice_client.errors import RunLeaseLostError, RunStateError
from lattice_client.runstore import RunStore
from lattice_client.settings import is_cluster_url
from lattice_mailbox.message import TeamMessage

from ...agent.call_gate import current_call_gate
from ...agent.loop import SuspendQuery
from ...team.mailbox_state import MailboxToolState
from ...team.member import TeamMember
from ...team.team import Team
from ...tools.tool import ToolContext
from ..run.budget import BUDGET_METADATA_KEY
from ..run.completion import apply_completion
from ..run.context import WorkerContext
from ..run.events import public_message
from ..run.trace import TRACE_CARRIER_KEY
from ..run.work_items import WorkItemLinks
from ..run.writer import RunWriter
from .lease import LeadLease

logger = logging.getLogger("lattice_worker.runtime")


ASK_PLACEHOLDER = (
    "(lattice: member {member} is working on this ask as work item {work_item_id}; "
    "its answer replaces this text before your next turn)"
)
"""The ``ask`` tool result persisted while the member works; replaced on resume."""


current_run: ContextVar[str | None] = ContextVar("lattice_current_run", default=None)
"""The run whose lead query is running in this task (set by :func:`drive`)."""

current_lease: ContextVar[LeadLease | None] = ContextVar("lattice_current_lease", default=None)
"""The lead lease of the segment running in this task (set by :func:`drive`)."""

current_carrier: ContextVar[dict[str, str] | None] = ContextVar("lattice_current_carrier", default=None)
"""The carrier of the run's trace root when the run is traced (set by :func:`drive`)."""


class RunLinkingMailbox:
    """The mailbox the lead's member tools send through: before a work item's
    message is sent (and so becomes claimable by any worker), the work item is
    linked to the current run (``<prefix>:workitem:<id>``) and the run id is
    added to the message metadata, with the carrier of the run's trace root
    when the run is traced (``metadata["trace_carrier"]``, see
    :mod:`~lattice_worker.runtime.run.trace`). Everything else is the wrapped store.

    Under a lead lease the call is first journaled by its ``tool_use_id``
    (``RunStore.journal_call``, refused once the lease is lost: a stale worker
    sends nothing). When the journal already holds the call -- a recovering
    segment replays the batch its dead predecessor started -- the message sent
    then is returned instead of a new one, or, if it never reached the mailbox,
    it is sent now under the journaled work item id: each member call is sent
    once."""

    def __init__(
        self, inner: Any, runs: RunStore, writer: RunWriter, links: WorkItemLinks, team_name: str
    ) -> None:
        self.inner = inner
        self.runs = runs
        self.writer = writer
        self.links = links
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
        dedup_key: str | None = None,
    ) -> TeamMessage:
        run_id = current_run.get()
        if run_id and work_item_id:
            lease = current_lease.get()
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
                journal, source = self.runs.journal_call_call(run_id, lease.token, tool_use_id, entry)
                link = self.links.link_command(run_id, self.team_name, work_item_id)
                replies = await self.writer.write(
                    [journal, link], scripts=(source,), on_error=lease_error(lease, "journal_call")
                )
                earlier = self.runs.journal_reply(replies[0])
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
                    await self.links.link(run_id, self.team_name, [work_item_id])
            else:
                await self.links.link(run_id, self.team_name, [work_item_id])
            metadata = {**(metadata or {}), "run_id": run_id}
            if current_call_gate.get() is not None:  # a budgeted run: its members check the budget
                metadata[BUDGET_METADATA_KEY] = True
            carrier = current_carrier.get()
            if carrier is not None:
                metadata[TRACE_CARRIER_KEY] = dict(carrier)
        return await self.inner.send(
            from_,
            to,
            content,
            thread_id=thread_id,
            work_item_id=work_item_id,
            reply_to=reply_to,
            metadata=metadata,
            **({"dedup_key": dedup_key} if dedup_key is not None else {}),
        )


def lease_error(lease: LeadLease, operation: str) -> Any:
    """An ``on_error`` for :meth:`~lattice_worker.runtime.run.writer.RunWriter.write` of the fenced script call
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


class LeadTeamView:
    """The team as the lead's member tools see it: the same team, but sending
    through a :class:`RunLinkingMailbox`."""

    def __init__(self, team: Team, mailbox: RunLinkingMailbox) -> None:
        self._team = team
        self.mailbox = mailbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._team, name)


def _sent_event(team: str, message: TeamMessage) -> dict[str, Any]:
    """The ``team_message`` ``sent`` event of ``message`` as its wire dict
    (what ``TeamMessageEvent(subtype="sent", ...).model_dump()`` gives)."""
    return {
        "type": "team_message",
        "subtype": "sent",
        "team": team,
        "message": public_message(message),
        "error": None,
    }


class DistributedLeadRuntime:
    """The lead query's ``runtime`` in a worker: the member tools' dispatcher
    (``ask`` / ``handoff`` register work items) and ``after_tool_batch``
    (register, ring doorbells, suspend). With a ``journal`` (a
    :class:`~lattice_worker.runtime.lead.journal.LeadJournal`, under a lease)
    also the lead's tool journal, effect scope and approvals."""

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
        journal: Any = None,
    ) -> None:
        self.ctx = ctx
        self.team = team
        self.run_id = run_id
        self.lease = lease
        self.usage = usage
        if journal is not None:  # the lead's own tools: docs/tool-effects.md
            self.tool_journal = journal
            self.effect_scope = journal.effect_scope
            self.approve_tool_call = journal.approve_tool_call
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
        await self.ctx.events.emit(self.run_id, event)

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
            await self.ctx.usage.add(
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
    # suspend, the suspension. On a Redis Cluster the early outcomes lie in other
    # slots (other nodes, whose part of a pipeline may run before this run's node
    # ran the registration): they are read after the registration's reply instead.
    on_cluster = is_cluster_url(ctx.settings.state_url)
    early_read: list[tuple[Any, ...]] = (
        [] if on_cluster else [("mget", [ctx.keys.early_outcome(w) for w in ids])]
    )
    commands: list[tuple[Any, ...]] = [call, *early_read]
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
    replies = await ctx.writer.write(commands, scripts=scripts, on_error=on_error)
    if on_cluster:
        replies = [replies[0], await ctx.links.early_outcomes(ids), *replies[1:]]
    suspended: bool | None = None
    if len(replies) > 2:
        suspended = bool(replies[2])
        if suspended and lease is not None:
            lease.end()  # the suspension ended the segment (renewals stop quietly)
    await ctx.writer.sync(fence)  # a failed history write of the batch is raised here
    for item in ctx.runs.add_items_reply(replies[0]):
        ctx.steps.ring(item["mailbox_id"], item.get("message_id"))
    early = {w: json.loads(r) for w, r in zip(ids, replies[1], strict=True) if r}
    for work_item_id, outcome in early.items():
        result = await ctx.runs.complete_item(run_id, work_item_id, outcome)
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


__all__ = [
    "ASK_PLACEHOLDER",
    "DistributedLeadRuntime",
    "RunLinkingMailbox",
    "current_carrier",
    "current_lease",
    "current_run",
    "dispatch_items",
    "find_sent_message",
    "lease_error",
]
