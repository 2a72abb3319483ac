"""The lead's member tools: one tool per member, named exactly as the member.

The modes of calling a member (``ask`` / ``handoff`` /
``observe``, the handoff receipt; docs/tutorial.md, section 2) and the tool input
(``{mode, task, expected_output, acceptance_criteria}``); docs/architecture.md, "Teams in one process".

A tool call validates its input, puts the task in the member's mailbox (from
``"<team>::lead"``, a new work item id, thread id = the task message's id) and
hands the sent message to a :class:`Dispatcher`: the in-process
:class:`~lattice_worker.team.runner.TeamRunner` or the distributed runtime.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from lattice_mailbox.base import MessageTooLargeError
from lattice_mailbox.message import TeamMessage

from ..tools.tool import ToolContext, ToolDefinition, ToolResult
from .agent_tool import format_task
from .depth import DEPTH_METADATA_KEY, LIMIT_METADATA_KEY, effective_limit, next_depth
from .ids import lead_mailbox_id, mailbox_id, new_work_item_id
from .mailbox_state import TeamToolError
from .member import TeamMember
from .shape import TeamShape


@runtime_checkable
class Dispatcher(Protocol):
    """Runs what a member tool call asked for. The task message is already in the
    member's mailbox (``pending``) when either method is called.

    ``ask`` runs the member now and returns the tool result (text, or a
    :class:`ToolResult`); it raises to make the tool result an error.
    ``handoff`` registers the accepted work item; the runtime runs it after the
    tool batch (in-process) or in a worker (distributed).
    """

    async def ask(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> ToolResult | str: ...

    async def handoff(self, member: TeamMember, message: TeamMessage, ctx: ToolContext) -> None: ...


class MemberCallInput(BaseModel):
    """Model-facing input of a member tool."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["ask", "handoff", "observe"] = Field(
        description=(
            '"ask": run the member now and get its final answer as this tool result. '
            "\"handoff\": put the task in the member's mailbox and get an acceptance receipt; the member's report "
            "arrives after this tool batch, before your next turn. "
            '"observe": not supported.'
        )
    )
    task: str = Field(min_length=1, description="The task, self-contained: the member sees only this text.")
    expected_output: str | None = Field(default=None, description="What the answer should look like.")
    acceptance_criteria: list[str] | None = Field(
        default=None, description="Checks the answer must pass, one per item."
    )


def handoff_receipt(member: TeamMember, message: TeamMessage) -> dict[str, Any]:
    """The handoff tool result: proof of acceptance, not a delivery
    (``status: "accepted"``, ``phase: "queued"``, ``completion_pending: true``)."""
    return {
        "status": "accepted",
        "phase": "queued",
        "completion_pending": True,
        "member": member.name,
        "mailbox": message.to,
        "message_id": message.id,
        "work_item_id": message.work_item_id,
        "thread_id": message.thread_id,
    }


def _resolve_dispatcher(dispatcher: Dispatcher | None, ctx: ToolContext) -> Dispatcher | None:
    if dispatcher is not None:
        return dispatcher
    runtime = ctx.runtime
    if callable(getattr(runtime, "ask", None)) and callable(getattr(runtime, "handoff", None)):
        return runtime  # type: ignore[return-value]
    return None


def _description(team_name: str, member: TeamMember) -> str:
    who = f'team member "{member.name}"'
    if member.role:
        who += f" (role: {member.role})"
    text = f'Delegate work to {who} of team "{team_name}".'
    if member.focus:
        text += f" Focus: {member.focus}."
    if member.kind == "spec":
        text += " Each task starts a fresh session with no memory of earlier tasks: make it self-contained."
    text += (
        ' Modes: "ask" waits for the member\'s final answer in this call; "handoff" queues the task and returns a '
        "receipt at once (the member's report reaches you after this tool batch; hand off independent tasks in one "
        'batch); "observe" is not supported.'
    )
    return text


def _team_limit(team: TeamShape, active: Any) -> int:
    """The team's ``max_delegate_depth`` as the runtime driving the lead applies
    it: a team runner's options (they may override the team's), else the team's own."""
    limit = getattr(getattr(active, "options", None), "max_delegate_depth", None)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return limit
    return team.runner_options.max_delegate_depth


async def _send_task(
    team: TeamShape, member_name: str, data: MemberCallInput, ctx: ToolContext, depth: int, limit: int
) -> TeamMessage:
    """Put one task in ``member_name``'s mailbox (from the lead, a new work item id);
    ``depth``: the delegation depth the member will run at; ``limit``: the team's
    limit (:func:`_team_limit`), tightened by the one in effect."""
    return await team.mailbox.send(
        lead_mailbox_id(team.name),
        mailbox_id(team.name, member_name),
        format_task(data),
        work_item_id=new_work_item_id(),
        metadata={
            "kind": "task",
            "mode": data.mode,
            "tool_use_id": ctx.tool_use_id,
            "member": member_name,
            "team": team.name,
            "expected_output": data.expected_output,
            "acceptance_criteria": data.acceptance_criteria,
            DEPTH_METADATA_KEY: depth,
            LIMIT_METADATA_KEY: effective_limit(limit),
        },
    )


def make_member_tool(
    team: TeamShape, member: TeamMember, dispatcher: Dispatcher | None = None
) -> ToolDefinition:
    """The lead tool for one member (see :func:`make_lead_member_tools`)."""
    team_name = team.name

    async def handler(data: MemberCallInput, ctx: ToolContext) -> ToolResult | str:
        if data.mode == "observe":
            raise TeamToolError(
                f'mode "observe" is unsupported for member "{member.name}": this runtime offers no observable '
                'long-running work. Use "ask" or "handoff".'
            )
        active = _resolve_dispatcher(dispatcher, ctx)
        if active is None:
            raise TeamToolError(
                f'mode "{data.mode}" needs a team runtime: call the team (team.query / team.prompt) instead of '
                "querying its lead directly. Nothing was sent."
            )
        if not data.task.strip():
            raise TeamToolError("task must not be blank; nothing was sent")
        limit = _team_limit(team, active)
        depth = next_depth(f'member "{member.name}"', limit)
        try:
            message = await _send_task(team, member.name, data, ctx, depth, limit)
        except MessageTooLargeError as exc:
            raise TeamToolError(
                f'the task for member "{member.name}" is too large for the team mailbox ({exc}). Nothing was '
                "sent: shorten the task (put large inputs in a file and give its path)."
            ) from None
        if data.mode == "ask":
            return await active.ask(member, message, ctx)
        await active.handoff(member, message, ctx)
        return json.dumps(handoff_receipt(member, message))

    return ToolDefinition(
        name=member.name,
        description=_description(team_name, member),
        input_model=MemberCallInput,
        handler=handler,
        kind="agent_tool",
        # Sequential on purpose: the tasks must enter the mailboxes in tool_use order, which is
        # the handoff order the reports (and each member's FIFO queue) follow.
        is_concurrency_safe=False,
        metadata={"team": team_name, "member": member.name, "team_member_tool": True},
    )


def make_lead_member_tools(team: TeamShape, dispatcher: Dispatcher | None = None) -> list[ToolDefinition]:
    """One tool per member of ``team``, named exactly as the member (kind ``"agent_tool"``).

    Input ``{mode: "ask" | "handoff" | "observe", task, expected_output?,
    acceptance_criteria?: list[str]}``; a missing or blank ``task`` is an error
    tool result and nothing is sent, as is a call beyond the team's
    ``max_delegate_depth`` (:mod:`lattice_worker.team.depth`; the task message
    carries the member's depth in ``metadata["delegate_depth"]``). ``handoff`` returns the receipt JSON
    (:func:`handoff_receipt`); ``ask`` returns the dispatcher's answer;
    ``observe`` is an error result ("unsupported").

    ``dispatcher``: the :class:`Dispatcher` to use; when ``None`` each call uses
    the query's runtime (``ctx.runtime``) if it has ``ask`` and ``handoff``, and
    answers with an error result (nothing sent) when there is none.
    """
    return [make_member_tool(team, member, dispatcher) for member in team.members]


__all__ = [
    "Dispatcher",
    "MemberCallInput",
    "format_task",
    "handoff_receipt",
    "make_lead_member_tools",
    "make_member_tool",
]
