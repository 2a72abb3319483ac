"""The in-process team runner: the lead's query runtime.

After a batch with handoffs the lead model is not called again until every
accepted item completed or failed; reports come in handoff order; up to
``max_concurrent_work_items`` items run at once across mailboxes, one mailbox
serial; one failure never stops the others; an abort cancels the current and
remaining accepted work before propagating; a traced ``query`` has one root
run (docs/architecture.md, "Teams in one process").

A :class:`TeamRunner` serves one team query: it is the lead's ``runtime``
query option (docs/contracts.md) and the :class:`~lattice_worker.team.lead_tools.Dispatcher`
the member tools call. Its ``after_tool_batch`` runs the batch's accepted
handoffs and returns the report message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lattice_mailbox.message import TERMINAL_STATUSES, MessageStatus, TeamMessage

from ..errors import AbortError, ConfigError
from ..tools.tool import ToolContext
from ..tracing.base import TraceContext, TraceEmitter
from .depth import DEFAULT_MAX_DELEGATE_DEPTH, delegation_limit
from .events import TeamMessageEvent, failure_from_exception
from .ids import mailbox_id
from .mailbox_state import EmitFn, MailboxToolState, TeamToolError, emit_event
from .member import TeamMember
from .reports import TeamResultMessage, format_report_message
from .shape import TeamShape
from .work import WorkItemOutcome, outcome_tool_text, run_work_item

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal
    from ..tracing.base import ContextTracer

logger = logging.getLogger("lattice_worker.team")

#: Query options a team run uses itself (the rest go to the lead only).
MEMBER_QUERY_OPTIONS = ("stream",)

POLL_SECONDS = 0.05
"""How often (seconds) a runner re-checks a message another process holds."""


@dataclass(frozen=True)
class RunnerOptions:
    """Runner settings (the team runtime's limits).

    ``max_concurrent_work_items``: how many accepted work items of one tool
    batch may run at the same time, across different member mailboxes (items
    of one mailbox always run one after another). A positive int, default 1
    (serial).

    ``max_delegate_depth``: the deepest delegation allowed under this team
    (:mod:`lattice_worker.team.depth`): its lead runs at depth 0 (or at its
    member's depth when the team is nested), members one deeper; a member
    call, ``agent_tool`` or ``delegate_tool`` call that would go beyond is an
    error tool result and nothing is sent. A positive int, default
    :data:`~lattice_worker.team.depth.DEFAULT_MAX_DELEGATE_DEPTH` (3).

    Raises :class:`ConfigError` for a value that is not a positive int.
    """

    max_concurrent_work_items: int = 1
    max_delegate_depth: int = DEFAULT_MAX_DELEGATE_DEPTH

    def __post_init__(self) -> None:
        for name in ("max_concurrent_work_items", "max_delegate_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"runner: {name} must be a positive integer, got {value!r}")


def runner_options(value: RunnerOptions | dict[str, Any] | None) -> RunnerOptions:
    """Accept ``None`` (defaults), a :class:`RunnerOptions` or a dict of its
    fields. Raises :class:`ConfigError` on an unknown key or a bad value."""
    if value is None:
        return RunnerOptions()
    if isinstance(value, RunnerOptions):
        return value
    if isinstance(value, dict):
        for key in value:
            if key not in ("max_concurrent_work_items", "max_delegate_depth"):
                raise ConfigError(
                    f'runner: unknown option "{key}"; expected max_concurrent_work_items or max_delegate_depth'
                )
        return RunnerOptions(**value)
    raise ConfigError(f"runner must be a RunnerOptions, a dict or None, got {type(value).__name__}")


@dataclass
class _Item:
    member: TeamMember
    message: TeamMessage


def _public(message: TeamMessage) -> dict[str, Any]:
    return message.model_copy(update={"claim_token": None}).to_json_dict()


class TeamRunner:
    """Runs one team query in this process.

    Args:
        team: the :class:`~lattice_worker.team.team.Team`.
        options: :class:`RunnerOptions` (or a dict / ``None``).
        signal: the run's abort signal (also passed to every member run).
        emit: receives team events when the runner is driven directly
            (``Team.query`` sets its own stream).
        tracer / trace_context: the team tracer and the root run context.
        member_options: extra query options for member runs (e.g. ``stream``).
    """

    def __init__(
        self,
        team: TeamShape,
        options: RunnerOptions | dict[str, Any] | None = None,
        *,
        signal: AbortSignal | None = None,
        emit: EmitFn | None = None,
        tracer: ContextTracer | None = None,
        trace_context: TraceContext | None = None,
        member_options: dict[str, Any] | None = None,
    ) -> None:
        self.team = team
        self.options = runner_options(options)
        self.signal = signal
        self.emit = emit
        self.tracer = tracer
        self.trace_context = trace_context
        self.member_options = dict(member_options or {})
        self._pending: list[_Item] = []
        self._outcomes: dict[str, WorkItemOutcome] = {}
        self._handed_out: list[str] = []  # message ids of this query's asks and handoffs, in order
        self.team_mailbox_state: MailboxToolState | None = None
        if team.expose_lead_mailbox_tools:
            self.team_mailbox_state = MailboxToolState(
                team_name=team.name,
                self_name="lead",
                member_names=[m.name for m in team.members],
                mailbox=team.mailbox,
                emit=self._emit,
            )

    # -- events -------------------------------------------------------------------

    async def _emit(self, event: Any) -> None:
        if (
            self.tracer is not None
            and self.trace_context is not None
            and event.type in ("team_message", "team_agent")
        ):
            await TraceEmitter(self.tracer, self.trace_context).emit(event.type, event.model_dump())
        await emit_event(self.emit, event)

    async def _emit_member_event(self, event: Any) -> None:
        # run_work_item traces its own team events; only forward them here.
        await emit_event(self.emit, event)

    # -- Dispatcher ---------------------------------------------------------------

    async def handoff(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> None:
        """Register an accepted handoff; it runs in :meth:`after_tool_batch`."""
        self._pending.append(_Item(member, message))
        self._handed_out.append(message.id)
        await self._emit(TeamMessageEvent(subtype="sent", team=self.team.name, message=_public(message)))

    async def ask(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> str:
        """Run the member on ``message`` now; returns its answer (the structured
        result as JSON when there is one). Raises :class:`TeamToolError` (an
        error tool result) when the work item failed or was cancelled."""
        self._handed_out.append(message.id)
        await self._emit(TeamMessageEvent(subtype="sent", team=self.team.name, message=_public(message)))
        try:
            outcome = await self.run_message(member, message.id)
        except AbortError:
            # aborted before the member started: the accepted ask must not stay pending
            await self.cancel_items([_Item(member, message)], reason="the run was aborted")
            raise
        except Exception as exc:  # the runtime could not run it (a mailbox error...): one failed item
            outcome = await self._runtime_failure(_Item(member, message), exc)
        await self._consume_report(outcome)
        if outcome.status in ("failed", "cancelled"):
            raise TeamToolError(outcome.content)
        if outcome.status == "open":
            return f"(progress only; the work item stays open) {outcome.content}"
        return outcome_tool_text(outcome)

    # -- runtime seam ---------------------------------------------------------------

    async def after_tool_batch(self, outcome: Any) -> list[dict[str, Any]] | None:
        """Run the batch's accepted handoffs, then return ``[report message]``
        (reports in handoff order), or ``None`` when the batch had no handoff.

        When the run's signal is aborted, the current and remaining accepted work
        is marked ``cancelled`` first and the report says so; the lead's loop then
        ends the query with ``error_abort`` (it checks the signal before its next
        model request), so the abort propagates as the query's result."""
        items, self._pending = self._pending, []
        if not items:
            return None
        outcomes = await self.run_items(items)
        return [format_report_message(outcomes)] if outcomes else None

    async def run_items(self, items: list[_Item]) -> list[WorkItemOutcome]:
        """Run accepted items: at most ``max_concurrent_work_items`` at once across
        mailboxes, each mailbox serial, failures isolated. Returns the outcomes in
        the order of ``items``."""
        semaphore = asyncio.Semaphore(self.options.max_concurrent_work_items)
        results: dict[str, WorkItemOutcome] = {}

        async def one(item: _Item) -> None:
            box = item.message.to
            async with self.team.mailbox_lock(box), semaphore:
                if self.signal is not None and self.signal.aborted:
                    return
                try:
                    results[item.message.id] = await self._run_locked(item.member, item.message.id)
                except AbortError:
                    return
                except Exception as exc:  # a runtime failure is one failed item, never the batch
                    results[item.message.id] = await self._runtime_failure(item, exc)

        tasks = [asyncio.create_task(one(item)) for item in items]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.cancel_items(
                [i for i in items if i.message.id not in results], reason="the run stopped"
            )
            raise
        if self.signal is not None and self.signal.aborted:
            rest = [i for i in items if i.message.id not in results]
            await self.cancel_items(rest, reason="the run was aborted")
            for item in rest:
                outcome = self._outcomes.get(item.message.id) or await self._observe(item.message.id)
                if outcome is not None:
                    results[item.message.id] = outcome
        outcomes = [results[item.message.id] for item in items if item.message.id in results]
        for outcome in outcomes:
            await self._consume_report(outcome)
        return outcomes

    async def _runtime_failure(self, item: _Item, exc: Exception) -> WorkItemOutcome:
        """An item the runtime itself could not run (a mailbox error...): mark it
        ``failed`` if still open, report upstream, emit ``failed``."""
        logger.warning(
            "team %s: work item %s failed in the runtime", self.team.name, item.message.id, exc_info=True
        )
        failure = failure_from_exception(exc)
        mailbox = self.team.mailbox
        report = None
        message = item.message
        try:
            current = await mailbox.get(message.id)
            if current is not None and current.status not in TERMINAL_STATUSES:
                await mailbox.update_status(message.id, MessageStatus.FAILED)
                message = current.model_copy(update={"status": MessageStatus.FAILED})
                report = await mailbox.send(
                    message.to,
                    message.from_,
                    f"Work item {message.work_item_id} failed in the team runtime ({failure['code']}): "
                    f"{failure['message']}",
                    thread_id=message.thread_id,
                    work_item_id=message.work_item_id,
                    reply_to=message.id,
                    metadata={
                        "kind": "failure",
                        "member": item.member.name,
                        "status": "failed",
                        "error": failure,
                    },
                )
        except Exception:
            logger.warning(
                "team %s: could not record the failure of %s", self.team.name, message.id, exc_info=True
            )
        await self._emit(
            TeamMessageEvent(subtype="failed", team=self.team.name, message=_public(message), error=failure)
        )
        outcome = WorkItemOutcome(
            message=message, status="failed", content=failure["message"], error=failure, report=report
        )
        self._outcomes[item.message.id] = outcome
        return outcome

    async def cancel_items(self, items: list[_Item], *, reason: str) -> None:
        """Mark every item whose message is still ``pending`` as ``cancelled``
        (emitting ``team_message`` ``cancelled``), so no accepted work stays pending."""
        failure = {"code": "aborted", "message": reason, "error_type": "AbortError"}
        for item in items:
            current = await self.team.mailbox.get(item.message.id)
            if current is None or current.status != MessageStatus.PENDING:
                continue
            try:
                await self.team.mailbox.update_status(item.message.id, MessageStatus.CANCELLED)
            except Exception:  # moved on concurrently; it is not pending any more
                continue
            cancelled = current.model_copy(update={"status": MessageStatus.CANCELLED})
            self._outcomes[item.message.id] = WorkItemOutcome(
                message=cancelled, status="cancelled", content=reason, error=failure
            )
            await self._emit(
                TeamMessageEvent(
                    subtype="cancelled", team=self.team.name, message=_public(cancelled), error=failure
                )
            )

    async def cancel_pending(self, reason: str) -> None:
        """Cancel handoffs accepted but never run (the query ended before its
        ``after_tool_batch``)."""
        items, self._pending = self._pending, []
        if items:
            await self.cancel_items(items, reason=reason)

    # -- one mailbox ------------------------------------------------------------------

    async def run_message(self, member: TeamMember, message_id: str) -> WorkItemOutcome:
        """Process ``member``'s mailbox in FIFO order until ``message_id`` has ended
        (messages ahead of it run first: a mailbox is a queue), holding the
        mailbox's lock."""
        async with self.team.mailbox_lock(mailbox_id(self.team.name, member.name)):
            return await self._run_locked(member, message_id)

    async def _run_locked(self, member: TeamMember, message_id: str) -> WorkItemOutcome:
        mailbox = self.team.mailbox
        box = mailbox_id(self.team.name, member.name)
        while True:
            done = self._outcomes.get(message_id)
            if done is not None:
                return done
            if self.signal is not None and self.signal.aborted:
                raise AbortError(str(self.signal.reason) if self.signal.reason is not None else "aborted")
            claimed = await mailbox.claim_next(box)
            if claimed is None:
                outcome = await self._observe(message_id)
                if outcome is not None:
                    self._outcomes[message_id] = outcome
                    return outcome
                await asyncio.sleep(POLL_SECONDS)  # held elsewhere (another process): wait for it
                continue
            await self._emit(
                TeamMessageEvent(subtype="claimed", team=self.team.name, message=_public(claimed))
            )
            token = claimed.claim_token if callable(getattr(mailbox, "complete", None)) else None
            self._outcomes[claimed.id] = await run_work_item(
                self.team,
                member,
                claimed,
                mailbox=mailbox,
                token=token,
                signal=self.signal,
                tracer=self.tracer,
                trace_context=self.trace_context,
                emit=self._emit_member_event,
                query_options=self.member_options,
            )

    async def _observe(self, message_id: str) -> WorkItemOutcome | None:
        """The outcome of a message someone else finished, or ``None`` while it is
        still pending/processing elsewhere."""
        message = await self.team.mailbox.get(message_id)
        if message is None:
            raise LookupError(f"message {message_id} disappeared from the mailbox")
        if message.status not in TERMINAL_STATUSES and message.status != MessageStatus.READ:
            return None
        status = {"done": "done", "failed": "failed", "cancelled": "cancelled", "read": "open"}[
            message.status.value
        ]
        report = None
        for candidate in await self.team.mailbox.inbox(message.from_, "all"):
            if candidate.reply_to == message_id:
                report = candidate
        content = report.content if report is not None else f"message ended {message.status.value} elsewhere"
        error = report.metadata.get("error") if report is not None else None
        return WorkItemOutcome(message=message, status=status, content=content, error=error, report=report)

    def handed_out_outcomes(self) -> list[WorkItemOutcome]:
        """The outcomes of the work items this query handed out, in the order it did."""
        return [self._outcomes[i] for i in self._handed_out if i in self._outcomes]

    async def _consume_report(self, outcome: WorkItemOutcome) -> None:
        """The lead has the report now (tool result or report message): mark the
        upstream message ``done`` so the lead mailbox keeps only unread mail."""
        report = outcome.report
        if report is None:
            return
        try:
            await self.team.mailbox.update_status(report.id, MessageStatus.DONE)
        except Exception:  # already consumed or moved by someone else: nothing to do
            pass

    # -- a whole team query ------------------------------------------------------------

    async def query(self, prompt: Any, **query_options: Any) -> AsyncIterator[Any]:
        """Run the lead on ``prompt`` with this runner as its runtime, yielding the
        lead's SDK events merged with team events (``team_message``,
        ``team_agent``, ``agent_message``) as they happen; the last one is a
        :class:`~lattice_worker.team.reports.TeamResultMessage` (the lead's result
        plus this query's work items, ``failed_work_items`` among them).

        ``query_options`` go to the lead's query; ``signal``, ``tracer``,
        ``trace_context`` and ``stream`` also govern member runs. A ``tracer``
        (default: the team's ``tracer``) makes one root run (source ``{"kind": "team"}``) whose trace session the
        lead and every member share.
        """
        team = self.team
        lead = team.lead
        if "runtime" in query_options:
            raise ConfigError('team.query: "runtime" is set by the team runner and cannot be passed')
        signal = query_options.get("signal")
        tracer = query_options.pop("tracer", None)
        if tracer is None:
            tracer = getattr(team, "tracer", None)
        parent_ctx = query_options.pop("trace_context", None)
        if signal is not None:
            self.signal = signal
        for key in MEMBER_QUERY_OPTIONS:
            if key in query_options:
                self.member_options[key] = query_options[key]

        root: TraceEmitter | None = None
        if tracer is not None:
            self.tracer = tracer
            if parent_ctx is not None:
                self.trace_context = TraceContext(
                    session_id=parent_ctx.session_id,
                    source=dict(parent_ctx.source),
                    agent_session_id=parent_ctx.agent_session_id,
                    parent_run_id=parent_ctx.parent_run_id,
                )
            else:
                self.trace_context = TraceContext(
                    session_id=f"team-{uuid.uuid4().hex}", source={"kind": "team", "name": team.name}
                )
            root = TraceEmitter(tracer, self.trace_context)
            await root.emit(
                "run_start",
                {
                    "team": team.name,
                    "lead": getattr(lead, "name", None),
                    "members": [m.name for m in team.members],
                },
            )
            query_options["tracer"] = tracer
            query_options["trace_context"] = TraceContext(
                session_id=self.trace_context.session_id,
                source={
                    "kind": "team_lead",
                    "name": getattr(lead, "name", None) or "lead",
                    "team": team.name,
                },
                agent_session_id=getattr(lead, "session_id", None),
                parent_run_id=self.trace_context.run_id,
            )

        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        outer_emit = self.emit

        async def to_queue(event: Any) -> None:
            await queue.put(event)
            await emit_event(outer_emit, event)

        self.emit = to_queue

        async def produce() -> None:
            try:
                with delegation_limit(self.options.max_delegate_depth):
                    async with aclosing(lead.query(prompt, runtime=self, **query_options)) as stream:
                        async for event in stream:
                            await queue.put(event)
            except BaseException as exc:  # re-raised by the consumer
                await queue.put(_Failure(exc))
            finally:
                await queue.put(done)

        final: Any = None
        task = asyncio.create_task(produce())
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                if isinstance(item, _Failure):
                    raise item.exc
                if getattr(item, "type", None) == "result":
                    item = final = TeamResultMessage.of(item, self.handed_out_outcomes())
                yield item
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.cancel_pending("the lead's query ended before the handoff ran")
            self.emit = outer_emit
            if root is not None:
                await root.emit("result", _result_summary(final))


@dataclass
class _Failure:
    exc: BaseException


def _result_summary(result: Any) -> dict[str, Any]:
    if result is None:
        return {"subtype": "error", "is_error": True, "result": "", "error": "the lead produced no result"}
    data = result.model_dump() if hasattr(result, "model_dump") else dict(result)
    keep = ("subtype", "is_error", "result", "structured_result", "usage", "num_turns", "error", "error_type")
    return {k: data.get(k) for k in keep}


def create_team_runner(
    team: TeamShape,
    options: RunnerOptions | dict[str, Any] | None = None,
    *,
    max_concurrent_work_items: int | None = None,
    max_delegate_depth: int | None = None,
    signal: AbortSignal | None = None,
    emit: EmitFn | None = None,
    tracer: ContextTracer | None = None,
    trace_context: TraceContext | None = None,
) -> TeamRunner:
    """Build a :class:`TeamRunner` for ``team``.

    ``options`` defaults to the team's own runner options;
    ``max_concurrent_work_items`` / ``max_delegate_depth`` override it (positive
    ints, else :class:`ConfigError`). Use ``runner.query(prompt)`` like ``team.query``, or
    pass the runner as a lead query's ``runtime``. When you drive the lead
    yourself, call ``await runner.cancel_pending(reason)`` once its query has
    ended: a query that stops inside a tool batch (abort, interrupt, an
    abandoned stream) never reaches ``after_tool_batch``, and only this marks
    the handoffs it accepted ``cancelled`` (``runner.query`` does it for you).
    """
    opts = runner_options(options) if options is not None else team.runner_options
    if max_concurrent_work_items is not None:
        opts = dataclasses.replace(opts, max_concurrent_work_items=max_concurrent_work_items)
    if max_delegate_depth is not None:
        opts = dataclasses.replace(opts, max_delegate_depth=max_delegate_depth)
    return TeamRunner(team, opts, signal=signal, emit=emit, tracer=tracer, trace_context=trace_context)


__all__ = [
    "RunnerOptions",
    "TeamRunner",
    "create_team_runner",
    "runner_options",
]
