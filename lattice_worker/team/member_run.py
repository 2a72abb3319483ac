"""What a member run is given besides its agent: its prompt for a message, the
``runtime`` query option (:class:`MemberRuntime`) and its trace context under
the team's root run.

Used by :func:`~lattice_worker.team.work.run_work_item`.
"""

from __future__ import annotations

from typing import Any

from lattice_mailbox.message import TeamMessage

from ..tracing.base import TraceContext
from .ids import mailbox_id
from .mailbox_state import MailboxToolState
from .member import TeamMember

#: ``metadata["kind"]`` values of messages that *report* on earlier work
#: (replies, progress, failure reports, diagnostics). A member that receives
#: one is informed; it is not required to answer, so reports never ping-pong.
REPORT_KINDS = frozenset({"reply", "followup", "failure", "diagnostic"})


class MemberRuntime:
    """The ``runtime`` query option of a member run: it exposes the member's
    :class:`MailboxToolState` to the mailbox tools and injects nothing after
    tool batches. With a ``journal`` (the distributed runtime's tool journal of
    the work item) it also gives the loop ``tool_journal``, ``effect_scope`` and
    ``approve_tool_call`` (docs/contracts.md)."""

    def __init__(self, state: MailboxToolState, journal: Any = None) -> None:
        self.team_mailbox_state = state
        if journal is not None:
            self.tool_journal = journal
            self.effect_scope = journal.effect_scope
            self.approve_tool_call = journal.approve_tool_call

    async def after_tool_batch(self, outcome: Any) -> list[dict[str, Any]] | None:
        return None


def member_trace_context(
    parent: TraceContext | None, team: str, member: str, agent_session_id: str | None
) -> TraceContext | None:
    """The trace context of a member run under ``parent`` (the team's root
    run): same trace ``session_id``, the member's own session kept as
    ``agent_session_id``, ``source = {"kind": "team_member", "name", "member",
    "mailbox"}``, ``parent_run_id`` = the root run, and the root's
    ``remote_parent`` (a root traced in another process). ``None`` without a parent."""
    if parent is None:
        return None
    return TraceContext(
        session_id=parent.session_id,
        source={"kind": "team_member", "name": member, "member": member, "mailbox": mailbox_id(team, member)},
        agent_session_id=agent_session_id,
        parent_run_id=parent.run_id,
        remote_parent=parent.remote_parent,
    )


def member_prompt(team_name: str, member: TeamMember, message: TeamMessage) -> str:
    """The prompt a tool-capable member gets for ``message``."""
    who = f'You are "{member.name}", a member of team "{team_name}"'
    if member.role:
        who += f" (role: {member.role})"
    who += "."
    if member.focus:
        who += f" Your focus: {member.focus}."
    kind = message.metadata.get("kind")
    if kind in REPORT_KINDS:
        return (
            f"{who}\n\nA {kind} arrived in your mailbox from {message.from_} (message {message.id}, "
            f"about your message {message.reply_to}):\n\n{message.content}\n\n"
            "This is information for you; no reply is required."
        )
    return (
        f"{who}\n\nYou have been assigned message {message.id} (work item {message.work_item_id}, "
        f"thread {message.thread_id}) from {message.from_}:\n\n{message.content}\n\n"
        "When your work is finished, call team_reply with your final result: it goes back upstream and closes "
        "the message. Use team_followup only for progress that leaves the message open. If you end without "
        "either, the work item fails."
    )


__all__ = ["REPORT_KINDS", "MemberRuntime", "member_prompt", "member_trace_context"]
