"""The team mailbox tools: ``team_send``, ``team_inbox``, ``team_read``,
``team_reply``, ``team_followup``, ``team_status``.

Installed on every member (and, with ``expose_lead_mailbox_tools``, on the
lead); model-facing inputs as docs/tutorial.md shows them.

The tools are generic: one set is installed on an agent once, and every call
finds *who* is calling and *which message* it works on through the query's
runtime (``ToolContext.runtime.team_mailbox_state``, a
:class:`~lattice_worker.team.mailbox_state.MailboxToolState`).
A member run gets its state from :func:`~lattice_worker.team.work.run_work_item`;
the lead gets one from the team runner when ``expose_lead_mailbox_tools=True``.
Called outside a team run, each tool answers with an error result and changes
nothing.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lattice_mailbox.message import MessageStatus, TeamMessage

from ..tools.tool import ToolContext, ToolDefinition, ToolResult
from .mailbox_state import (
    MailboxToolState,
    TeamToolError,
)

MAILBOX_TOOL_NAMES = ("team_send", "team_inbox", "team_read", "team_reply", "team_followup", "team_status")

# --------------------------------------------------------------------------- inputs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeamSendInput(_Strict):
    to: str = Field(min_length=1, description='Recipient: a member name of your team, or "lead".')
    content: str = Field(min_length=1, description="The message text.")


class TeamInboxInput(_Strict):
    status: str | None = Field(
        default=None,
        description='Filter: "pending" (default), "processing", "read", "done", "failed", "cancelled", or "all".',
    )


class TeamReadInput(_Strict):
    message_id: str = Field(min_length=1, description="Id of a message in your own mailbox.")


class TeamReplyInput(_Strict):
    content: str = Field(min_length=1, description="Your final result for the message.")
    message_id: str | None = Field(
        default=None, description="The message to answer; defaults to the message you were assigned."
    )


class TeamFollowupInput(_Strict):
    content: str = Field(min_length=1, description="A progress note; the message stays open.")
    message_id: str | None = Field(
        default=None, description="The message to report on; defaults to the message you were assigned."
    )


class TeamStatusInput(_Strict):
    pass


# --------------------------------------------------------------------------- tools


def _state(ctx: ToolContext) -> MailboxToolState:
    state = getattr(ctx.runtime, "team_mailbox_state", None)
    if not isinstance(state, MailboxToolState):
        raise TeamToolError(
            f"{ctx.tool_name} can only be used inside a team run (a member working on a mailbox message, "
            "or a lead created with expose_lead_mailbox_tools=True); nothing changed"
        )
    return state


def _brief(message: TeamMessage, *, with_content: bool = True, limit: int = 2000) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": message.id,
        "from": message.from_,
        "to": message.to,
        "status": message.status.value,
        "thread_id": message.thread_id,
        "work_item_id": message.work_item_id,
        "reply_to": message.reply_to,
        "kind": message.metadata.get("kind"),
        "created_at": message.created_at,
    }
    if with_content:
        text = message.content
        out["content"] = (
            text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"
        )
    return out


async def _send(data: TeamSendInput, ctx: ToolContext) -> str:
    # the call's effect key and its text: the same call run again (same recorded turn) sends once,
    # while a model that reuses a tool_use id for another message still sends that one
    key = None
    if ctx.effect_key:
        key = f"{ctx.effect_key}:{hashlib.sha256(data.content.encode('utf-8', 'replace')).hexdigest()[:16]}"
    message = await _state(ctx).send(data.to, data.content, dedup_key=key)
    return json.dumps({"status": "sent", "message_id": message.id, "to": message.to})


async def _inbox(data: TeamInboxInput, ctx: ToolContext) -> str:
    state = _state(ctx)
    status = data.status or "pending"
    if status != "all":
        try:
            MessageStatus.parse(status)
        except ValueError as exc:
            raise TeamToolError(f'team_inbox: {exc} (or "all" for every status)') from None
    messages = await state.mailbox.inbox(state.mailbox_id, status)
    return json.dumps(
        {"mailbox": state.mailbox_id, "status": status, "messages": [_brief(m) for m in messages]}
    )


async def _read(data: TeamReadInput, ctx: ToolContext) -> str:
    message = await _state(ctx).read(data.message_id)
    return json.dumps(_brief(message, limit=100_000))


async def _reply(data: TeamReplyInput, ctx: ToolContext) -> ToolResult:
    state = _state(ctx)
    reply = await state.reply(data.content, data.message_id)
    text = json.dumps(
        {
            "status": "replied",
            "reply_message_id": reply.id,
            "closed_message_id": reply.reply_to,
            "to": reply.to,
        }
    )
    # Closing the assigned message finishes the member's work: end its turn here instead of
    # spending one more model request -- unless the agent must still call submit_output.
    closes_current = state.current is not None and reply.reply_to == state.current.id
    has_schema = getattr(ctx.agent, "output_schema", None) is not None
    return ToolResult(content=text, end_turn=closes_current and not has_schema)


async def _followup(data: TeamFollowupInput, ctx: ToolContext) -> str:
    message = await _state(ctx).followup(data.content, data.message_id)
    return json.dumps(
        {"status": "followup_sent", "message_id": message.id, "open_message_id": message.reply_to}
    )


async def _status(data: TeamStatusInput, ctx: ToolContext) -> str:
    return json.dumps({"mailboxes": await _state(ctx).status_counts()})


def make_mailbox_tools() -> list[ToolDefinition]:
    """The six team mailbox tools.

    Each finds its caller through ``ctx.runtime.team_mailbox_state``; see the
    module docstring. Refusals (unknown recipient, a message the caller never
    claimed, a lost claim) are error ``tool_result`` s that change nothing.
    The definitions hold no per-agent state, so one set is built per process
    and shared (a fresh list each call): building them derives JSON Schemas,
    which would otherwise dominate spawning a member session per work item.
    """
    global _SHARED_TOOLS
    if _SHARED_TOOLS is None:
        _SHARED_TOOLS = _build_mailbox_tools()
    return list(_SHARED_TOOLS)


_SHARED_TOOLS: list[ToolDefinition] | None = None


def _build_mailbox_tools() -> list[ToolDefinition]:
    spec = [
        (
            "team_send",
            "Send an asynchronous message to another member of your team (or to the lead).",
            TeamSendInput,
            _send,
        ),
        (
            "team_inbox",
            "List messages in your own mailbox (pending ones by default).",
            TeamInboxInput,
            _inbox,
        ),
        (
            "team_read",
            "Read a message from your own mailbox; a pending message is claimed for you (status read) so you can "
            "answer it with team_reply or team_followup.",
            TeamReadInput,
            _read,
        ),
        (
            "team_reply",
            "Send your final reply upstream and close the message (by default the message you were assigned). "
            "Call it exactly once when your work is finished; replying to your assigned message ends your turn.",
            TeamReplyInput,
            _reply,
        ),
        (
            "team_followup",
            "Send a progress note upstream without closing the message (by default the message you were assigned).",
            TeamFollowupInput,
            _followup,
        ),
        (
            "team_status",
            "Summarise message status counts for every mailbox of your team.",
            TeamStatusInput,
            _status,
        ),
    ]
    return [
        ToolDefinition(
            name=name, description=desc, input_model=model, handler=handler, metadata={"team_tool": True}
        )
        for name, desc, model, handler in spec
    ]


_INSTALLED: weakref.WeakSet[Any] = weakref.WeakSet()


def ensure_mailbox_tools(agent: Any) -> None:
    """Install the mailbox tools on ``agent`` (an ``Agent``) once.

    Raises :class:`~lattice_worker.errors.ConfigError` (from ``add_tools``) when
    the agent already has a different tool with one of these names.
    """
    if agent in _INSTALLED:
        return
    if _has_tool(agent, "team_reply"):
        _INSTALLED.add(agent)
        return
    agent.add_tools(make_mailbox_tools())
    _INSTALLED.add(agent)


def _has_tool(agent: Any, name: str) -> bool:
    for attr in ("tool_names", "tools"):
        value = getattr(agent, attr, None)
        if value is None:
            continue
        if callable(value):
            try:
                value = value()
            except TypeError:
                continue
        try:
            names = {getattr(t, "name", t) for t in value}
        except TypeError:
            continue
        return name in names
    return False


__all__ = ["MAILBOX_TOOL_NAMES", "ensure_mailbox_tools", "make_mailbox_tools"]
