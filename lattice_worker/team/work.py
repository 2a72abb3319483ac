"""One unit of member work: run a member on one claimed message.

The member claims, works and replies upstream; a member that ends without a
reply fails its message (``failed`` + a diagnostic upstream); member runs share
the root trace session, with ``source.kind == "team_member"``
(docs/architecture.md, "Teams in one process"; docs/tutorial.md, sections 3 and 4).

:func:`run_work_item` is shared by the in-process runner, ``Team.drain`` and
the distributed runtime's ``deliver`` task, so a message ends the same way
whichever of them ran it.

What it returns, :class:`WorkItemOutcome`, is defined in :mod:`.outcome`; the
member's prompt, ``runtime`` option and trace context in :mod:`.member_run`.
Both are re-exported here.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from lattice_mailbox.base import ClaimError, InvalidTransitionError, TeamMailbox
from lattice_mailbox.message import MessageStatus, TeamMessage

from ..errors import AbortError
from ..tracing.base import TraceContext, TraceEmitter
from .depth import (
    current_depth,
    delegated,
    delegation_limit,
    limit_in_effect,
    metadata_depth,
    metadata_limit,
)
from .events import (
    AgentMessageEvent,
    TeamAgentEvent,
    TeamMessageEvent,
    failure_from_exception,
    failure_from_result,
    failure_text,
    no_reply_failure,
)
from .ids import LEAD, mailbox_id
from .mailbox_state import EmitFn, MailboxToolState, UpstreamTooLargeError, emit_event, set_message_status
from .member import TeamMember
from .member_run import REPORT_KINDS, MemberRuntime, member_prompt, member_trace_context
from .member_tools import ensure_mailbox_tools
from .outcome import WorkItemOutcome, outcome_tool_text

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal
    from ..tracing.base import ContextTracer

logger = logging.getLogger("lattice_worker.team")


class _Sink:
    """Sends team events to ``emit`` and (``team_message`` / ``team_agent``
    only) to the tracer, under the team's root run context."""

    def __init__(
        self, emit: EmitFn | None, tracer: ContextTracer | None, trace_context: TraceContext | None, team: str
    ):
        self.emit = emit
        self.tracer: TraceEmitter | None = None
        if tracer is not None:
            ctx = trace_context or TraceContext(
                session_id=f"team-{team}", source={"kind": "team", "name": team}
            )
            self.tracer = TraceEmitter(tracer, ctx)

    async def __call__(self, event: Any) -> None:
        if self.tracer is not None and getattr(event, "type", None) in ("team_message", "team_agent"):
            await self.tracer.emit(event.type, event.model_dump())
        await emit_event(self.emit, event)


def _result_text(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        return str(result.get("result") or "")
    return str(getattr(result, "result", "") or "")


def _result_field(result: Any, name: str, default: Any = None) -> Any:
    if isinstance(result, dict):
        return result.get(name, default)
    return getattr(result, name, default)


def _event_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        return dump()
    return {"type": "unknown", "value": repr(event)}


async def _iterate_query(target: Any, prompt: str, options: dict[str, Any]) -> AsyncIterator[Any]:
    """Iterate ``target.query(prompt, **options)`` and always close it, so a
    member whose run is cancelled or fails mid-stream is released at once
    (an Agent holds one conversation until its query is closed)."""
    stream = target.query(prompt, **options)
    if inspect.isawaitable(stream):
        stream = await stream
    try:
        async for event in stream:
            yield event
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


async def run_work_item(
    team: Any,
    member: TeamMember,
    message: TeamMessage,
    *,
    mailbox: TeamMailbox,
    token: str | None = None,
    signal: AbortSignal | None = None,
    tracer: ContextTracer | None = None,
    trace_context: TraceContext | None = None,
    emit: EmitFn | None = None,
    agent: Any = None,
    query_options: dict[str, Any] | None = None,
    stream_events: bool = True,
    journal: Any = None,
    resume: bool = False,
) -> WorkItemOutcome:
    """Run ``member`` on ``message`` (already claimed, ``processing``) and end the message.

    Args:
        team: the :class:`~lattice_worker.team.team.Team` (``name`` and ``members`` are read).
        member: the member the message is addressed to.
        message: the claimed message.
        mailbox: the team's store.
        token: the claim token; when given every status change of ``message`` is a
            fenced ``mailbox.complete(id, token, status)``, else ``update_status``.
        signal: abort signal passed to the member's query.
        tracer / trace_context: the team's tracer and its root run context; the
            member run is traced as a child (see :func:`member_trace_context`).
        emit: async (or sync) callable receiving team events: ``team_agent``
            start/end, one ``agent_message`` per member SDK event, ``team_message``
            for replies, follow-ups, ``done`` / ``failed`` / ``cancelled``.
        agent: run this agent instead of the member's own (the distributed runtime
            passes a session rebuilt over a persisted history).
        query_options: extra query options for the member (``stream``...).
        stream_events: ``False`` leaves the member's token-level ``stream_event``
            SDK events out of ``emit`` (for an ``emit`` that would drop them anyway,
            like the distributed runtime's run streams); the member still streams.
        journal: the work item's tool journal (distributed runtime; see
            :class:`MemberRuntime`). A query it suspends (a call parked or waiting
            for an approval) ends the run with status ``"parked"``: the message
            was parked by the journal and nothing else is written.
        resume: ``agent``'s history already holds this item's conversation
            (a re-claimed work item): continue it (``query(None)``) instead of
            sending the task prompt again.

    Returns a :class:`WorkItemOutcome`; member failures never raise: an agent
    error (``MaxTurnsError``, ``APIError``...) marks
    the message ``failed`` and sends an upstream failure report carrying the
    normalised error in ``metadata["error"]``; a run that ends without
    ``team_reply`` / ``team_followup`` is ``failed`` with a ``no_reply``
    diagnostic upstream; a nested team / host member whose final answer cannot
    be sent upstream (too large for the store) is ``failed`` with code
    ``reply_failed``; an abort marks it ``cancelled``. A fenced-out
    completion (the claim was taken) writes nothing and returns ``failed`` with
    code ``claim_lost``. Raises only ``asyncio.CancelledError`` and mailbox
    errors of the upstream ``send``.

    The member runs at the delegation depth its message carries
    (``metadata["delegate_depth"]``, see :mod:`lattice_worker.team.depth`), else
    one below the running agent, under the limit the message carries
    (``metadata["delegate_limit"]``, see :func:`member_limit`) and the one
    already in effect, whichever is tighter.
    """
    with delegated(member_depth(message)), delegation_limit(member_limit(team, message)):
        return await _run_work_item(
            team,
            member,
            message,
            mailbox=mailbox,
            token=token,
            signal=signal,
            tracer=tracer,
            trace_context=trace_context,
            emit=emit,
            agent=agent,
            query_options=query_options,
            stream_events=stream_events,
            journal=journal,
            resume=resume,
        )


def member_depth(message: TeamMessage) -> int:
    """The delegation depth a member works on ``message`` at."""
    depth = metadata_depth(message.metadata)
    return current_depth() + 1 if depth is None else depth


def member_limit(team: Any, message: TeamMessage) -> int | None:
    """The delegation limit a member of ``team`` works on ``message`` under
    (the one already in effect still applies if tighter): the limit the
    message carries (the lead's team runner's, or the team's, tightened where
    it was sent); without one, the team's ``max_delegate_depth`` when no
    runtime set a limit (a worker), else ``None`` (a team runner's own limit
    is in effect: it may override the team's)."""
    carried = metadata_limit(message.metadata)
    if carried is not None:
        return carried
    if limit_in_effect() is not None:
        return None
    return getattr(getattr(team, "runner_options", None), "max_delegate_depth", None)


async def _run_work_item(
    team: Any,
    member: TeamMember,
    message: TeamMessage,
    *,
    mailbox: TeamMailbox,
    token: str | None,
    signal: AbortSignal | None,
    tracer: ContextTracer | None,
    trace_context: TraceContext | None,
    emit: EmitFn | None,
    agent: Any,
    query_options: dict[str, Any] | None,
    stream_events: bool,
    journal: Any,
    resume: bool,
) -> WorkItemOutcome:
    team_name: str = team.name
    member_names = [m.name for m in team.members]
    own_mailbox = mailbox_id(team_name, member.name)
    sink = _Sink(emit, tracer, trace_context, team_name)
    state = MailboxToolState(
        team_name=team_name,
        self_name=member.name,
        member_names=member_names,
        mailbox=mailbox,
        current=message,
        token=token,
        emit=sink,
    )
    kind = member.kind
    target = agent
    if target is None:
        target = member.agent.spawn() if kind == "spec" else member.agent
    takes_tools = agent is not None or kind in ("spec", "agent")
    is_report = message.metadata.get("kind") in REPORT_KINDS

    agent_event = {
        "team": team_name,
        "member": member.name,
        "mailbox": own_mailbox,
        "message_id": message.id,
        "work_item_id": message.work_item_id,
    }
    await sink(TeamAgentEvent(subtype="start", **agent_event))

    options: dict[str, Any] = dict(query_options or {})
    if signal is not None:
        options["signal"] = signal
    session_id = getattr(target, "session_id", None)
    child_ctx = member_trace_context(trace_context, team_name, member.name, session_id)
    if tracer is not None:
        options["tracer"] = tracer
    if child_ctx is not None:
        options["trace_context"] = child_ctx

    result: Any = None
    exc_failure: dict[str, Any] | None = None
    try:
        if takes_tools:
            ensure_mailbox_tools(target)
            options["runtime"] = MemberRuntime(state, journal)
            prompt = None if resume else member_prompt(team_name, member, message)
        else:
            prompt = message.content
        queried = takes_tools or kind == "team"  # gets the query options; a host AgentLike gets none
        host_prompt = None if queried else getattr(target, "prompt", None)
        if callable(host_prompt):
            value = host_prompt(prompt)  # a host AgentLike: only the prompt is passed
            result = await value if inspect.isawaitable(value) else value
        else:
            async with aclosing(_iterate_query(target, prompt, options if queried else {})) as stream:
                async for event in stream:
                    kind_of = _result_field(event, "type")
                    if kind_of == "result":
                        result = event
                    elif kind_of == "stream_event" and not stream_events:
                        continue
                    await sink(
                        AgentMessageEvent(
                            team=team_name,
                            member=member.name,
                            mailbox=own_mailbox,
                            message=_event_dict(event),
                        )
                    )
    except AbortError as exc:
        exc_failure = failure_from_exception(exc)
    except Exception as exc:  # isolate: a member that raises is one failed work item
        logger.warning("member %s raised on message %s", member.name, message.id, exc_info=True)
        exc_failure = failure_from_exception(exc)

    subtype = _result_field(result, "subtype") if result is not None else None
    end = subtype if subtype is not None else ("error" if exc_failure else None)
    await sink(TeamAgentEvent(subtype="end", result=end, **agent_event))

    structured = _result_field(result, "structured_result") if result is not None else None
    replied = state.current_replied
    if replied is not None:
        return WorkItemOutcome(
            message=_ended(message, MessageStatus.DONE),
            status="done",
            content=replied.content,
            structured_result=structured
            if structured is not None
            else replied.metadata.get("structured_result"),
            report=replied,
        )
    if state.claim_lost is not None:
        return _claim_lost(message, state.claim_lost)
    if subtype == "suspended" and journal is not None and journal.waiting is not None:
        wait = journal.waiting
        return WorkItemOutcome(
            message=_ended(message, MessageStatus.PARKED),
            status="parked",
            content=f"{wait['kind']} {wait['id']}: {wait['reason']}",
        )

    aborted = (
        (signal is not None and signal.aborted)
        or subtype == "error_abort"
        or (exc_failure is not None and exc_failure["code"] == "aborted")
    )
    is_error = exc_failure is not None or bool(_result_field(result, "is_error", False))
    if aborted:
        failure = exc_failure or (failure_from_result(result) if result is not None else None)
        if failure is None or failure["code"] != "aborted":
            failure = {"code": "aborted", "message": "the run was aborted", "error_type": "AbortError"}
        return await _cancel(mailbox, sink, team_name, message, token, failure)
    if is_error:
        failure = exc_failure or failure_from_result(result)
        return await _fail(mailbox, sink, team_name, member.name, message, token, failure, kind="failure")

    text = _result_text(result)
    if not takes_tools:
        # A nested team or a host AgentLike cannot call team_reply: its final answer is the reply.
        try:
            reply = await state.reply(text or "(empty result)", None, structured_result=structured)
        except Exception as exc:  # nothing was sent
            if state.claim_lost is not None:
                return _claim_lost(message, state.claim_lost)
            # e.g. an answer too large for the store: the message is still open, so fail it
            # with a (small) failure report; _fail maps "already changed" to _unfinished.
            failure = failure_from_exception(exc)
            failure["code"] = "reply_failed"
            if isinstance(exc, UpstreamTooLargeError):
                failure["message"] = f"the member's final answer is too large to send upstream: {exc.detail}"
            return await _fail(mailbox, sink, team_name, member.name, message, token, failure, kind="failure")
        return WorkItemOutcome(
            message=_ended(message, MessageStatus.DONE),
            status="done",
            content=reply.content,
            structured_result=structured,
            report=reply,
        )
    if state.followups:
        opened = await _set_status(mailbox, message, MessageStatus.READ, token)
        if isinstance(opened, WorkItemOutcome):
            return opened
        last = state.followups[-1]
        return WorkItemOutcome(
            message=opened, status="open", content=last.content, structured_result=structured, report=last
        )
    if is_report:
        # Information for the member (a reply to its own message...): no answer required.
        done = await _set_status(mailbox, message, MessageStatus.DONE, token)
        if isinstance(done, WorkItemOutcome):
            return done
        await sink(TeamMessageEvent(subtype="done", team=team_name, message=done.to_json_dict()))
        return WorkItemOutcome(message=done, status="done", content=text, structured_result=structured)
    failure = no_reply_failure(member.name)
    logger.warning(
        'team %s: member "%s" ended without team_reply or team_followup; work item %s (message %s) failed '
        "(no_reply). A member must call team_reply with its result.",
        team_name,
        member.name,
        message.work_item_id,
        message.id,
    )
    if text:
        failure["message"] += f". The member's last text was: {text[:2000]}"
    return await _fail(mailbox, sink, team_name, member.name, message, token, failure, kind="diagnostic")


def _ended(message: TeamMessage, status: MessageStatus) -> TeamMessage:
    """The outcome's copy of ``message``: its final ``status``, no claim token."""
    return message.model_copy(update={"status": status, "claim_token": None})


def _claim_lost(message: TeamMessage, exc: BaseException, content: str | None = None) -> WorkItemOutcome:
    """``failed`` with code ``claim_lost``: this attempt wrote nothing."""
    failure = failure_from_exception(exc)
    failure["code"] = "claim_lost"
    return WorkItemOutcome(
        message=message.model_copy(update={"claim_token": None}),
        status="failed",
        content=content or f"this attempt lost its claim and wrote nothing: {exc}",
        error=failure,
    )


def _unfinished(message: TeamMessage, exc: BaseException) -> WorkItemOutcome:
    return _claim_lost(
        message,
        exc,
        f"message {message.id} was changed by someone else while the member worked; nothing written: {exc}",
    )


async def _set_status(
    mailbox: TeamMailbox, message: TeamMessage, status: MessageStatus, token: str | None
) -> TeamMessage | WorkItemOutcome:
    """Move ``message`` to ``status`` (fenced when ``token`` is given) and return
    its ended copy, or the ``claim_lost`` outcome when the claim was taken or the
    message was changed by someone else (then nothing was written)."""
    try:
        await set_message_status(mailbox, message.id, status, token)
    except ClaimError as exc:
        return _claim_lost(message, exc)
    except (InvalidTransitionError, LookupError) as exc:
        return _unfinished(message, exc)
    return _ended(message, status)


async def _cancel(
    mailbox: TeamMailbox,
    sink: _Sink,
    team: str,
    message: TeamMessage,
    token: str | None,
    failure: dict[str, Any],
) -> WorkItemOutcome:
    cancelled = await _set_status(mailbox, message, MessageStatus.CANCELLED, token)
    if isinstance(cancelled, WorkItemOutcome):
        return cancelled
    await sink(
        TeamMessageEvent(subtype="cancelled", team=team, message=cancelled.to_json_dict(), error=failure)
    )
    return WorkItemOutcome(message=cancelled, status="cancelled", content=failure["message"], error=failure)


async def _fail(
    mailbox: TeamMailbox,
    sink: _Sink,
    team: str,
    member: str,
    message: TeamMessage,
    token: str | None,
    failure: dict[str, Any],
    *,
    kind: str,
) -> WorkItemOutcome:
    """Mark ``message`` failed (fenced first), send the upstream failure report
    (``kind`` = ``"failure"`` or ``"diagnostic"``) and emit ``failed``."""
    failed = await _set_status(mailbox, message, MessageStatus.FAILED, token)
    if isinstance(failed, WorkItemOutcome):
        return failed
    text = failure_text(message.work_item_id, member, failure["code"], failure["message"])
    report = await mailbox.send(
        mailbox_id(team, member),
        message.from_,
        text,
        thread_id=message.thread_id,
        work_item_id=message.work_item_id,
        reply_to=message.id,
        metadata={"kind": kind, "member": member, "status": "failed", "error": failure, "team": team},
    )
    await sink(TeamMessageEvent(subtype="failed", team=team, message=failed.to_json_dict(), error=failure))
    return WorkItemOutcome(message=failed, status="failed", content=text, error=failure, report=report)


__all__ = [
    "LEAD",
    "MemberRuntime",
    "REPORT_KINDS",
    "WorkItemOutcome",
    "member_depth",
    "member_limit",
    "member_prompt",
    "member_trace_context",
    "outcome_tool_text",
    "run_work_item",
]
