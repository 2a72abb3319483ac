"""Team runtime events and the normalised failure record.

``team.query()`` streams the lead's SDK
messages plus ``team_message``, ``team_agent`` and nested ``agent_message``
events (docs/tutorial.md, section 5); a failed work item gives a ``team_message`` event with
``subtype: "failed"`` and a normalised error. The models serialise with
``model_dump()`` to plain JSON-ready dicts, exactly like the loop's SDK events,
so the distributed runtime can put them on a run's event stream unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..errors import (
    AbortError,
    APIError,
    ConcurrentQueryError,
    MaxTurnsError,
    MissingOutputError,
    ModelTimeoutError,
    ToolExecutionError,
)

TeamMessageSubtype = Literal["sent", "claimed", "reply", "followup", "done", "failed", "cancelled"]


class TeamMessageEvent(BaseModel):
    """A mailbox message changed: ``sent`` (a task was put in a member's
    mailbox), ``claimed``, ``reply`` / ``followup`` (a member wrote upstream;
    ``message`` is the upstream message), ``done`` / ``failed`` / ``cancelled``
    (``message`` is the original with its final status; ``error`` is the
    normalised failure for ``failed`` and ``cancelled``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["team_message"] = "team_message"
    subtype: TeamMessageSubtype
    team: str
    message: dict[str, Any]
    error: dict[str, Any] | None = None


class TeamAgentEvent(BaseModel):
    """A member run started (``start``) or ended (``end``) on one message.
    ``result`` is the member's result subtype on ``end`` (``success``,
    ``error_max_turns``...), ``None`` on ``start``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["team_agent"] = "team_agent"
    subtype: Literal["start", "end"]
    team: str
    member: str
    mailbox: str
    message_id: str
    work_item_id: str | None = None
    result: str | None = None


class AgentMessageEvent(BaseModel):
    """One SDK event of a member's own run, wrapped: ``message`` is that
    event's wire dict (``{"type": "assistant", ...}``; for a nested team it can
    itself be a team event)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["agent_message"] = "agent_message"
    team: str
    member: str
    mailbox: str
    message: dict[str, Any]


TeamEvent = TeamMessageEvent | TeamAgentEvent | AgentMessageEvent


class AgentRuntimeFailure(BaseModel):
    """A member failure in one shape for reports, events and metadata.

    ``code``: ``error_max_turns`` | ``api_error`` | ``error_timeout`` |
    ``error_missing_output`` | ``aborted`` | ``no_reply`` | ``claim_lost`` |
    ``runtime_error`` | ``error`` (anything else); ``message``: human text;
    ``error_type``: the Python error class name (``MaxTurnsError``...) or
    ``None`` when no error class applies (``no_reply``).
    """

    model_config = ConfigDict(extra="forbid")

    code: str
    message: str
    error_type: str | None = None


# result subtype -> (code, error type)
_SUBTYPE_CODES: dict[str, tuple[str, str | None]] = {
    "error_max_turns": ("error_max_turns", MaxTurnsError.__name__),
    "error_abort": ("aborted", AbortError.__name__),
    "error_timeout": ("error_timeout", ModelTimeoutError.__name__),
    "error_missing_output": ("error_missing_output", MissingOutputError.__name__),
    "interrupted": ("interrupted", None),
}

# exception class name -> code
_TYPE_CODES: dict[str, str] = {
    MaxTurnsError.__name__: "error_max_turns",
    APIError.__name__: "api_error",
    AbortError.__name__: "aborted",
    ModelTimeoutError.__name__: "error_timeout",
    MissingOutputError.__name__: "error_missing_output",
    ToolExecutionError.__name__: "tool_error",
    ConcurrentQueryError.__name__: "concurrent_query",
    "ClaimTakenError": "claim_lost",
    "ClaimMissingError": "claim_lost",
}


def failure_from_exception(exc: BaseException) -> dict[str, Any]:
    """The normalised failure dict of an exception (see :class:`AgentRuntimeFailure`)."""
    name = type(exc).__name__
    code = _TYPE_CODES.get(name)
    if code is None:
        code = "api_error" if isinstance(exc, APIError) else "runtime_error"
    return AgentRuntimeFailure(code=code, message=str(exc) or name, error_type=name).model_dump()


def failure_from_result(result: Any) -> dict[str, Any]:
    """The normalised failure dict of an error ``ResultMessage`` (or its dict).

    Uses the result's ``subtype``; a plain ``"error"`` subtype is refined by the
    result's ``error_type`` when the loop reports one (``APIError`` ->
    ``api_error``).
    """
    get = result.get if isinstance(result, dict) else lambda k, d=None: getattr(result, k, d)
    subtype = str(get("subtype") or "error")
    error_type = get("error_type")
    message = get("error") or get("result") or subtype
    if not isinstance(message, str):
        message = str(message)
    if subtype in _SUBTYPE_CODES:
        code, default_type = _SUBTYPE_CODES[subtype]
        return AgentRuntimeFailure(
            code=code, message=message, error_type=error_type or default_type
        ).model_dump()
    if isinstance(error_type, str) and error_type in _TYPE_CODES:
        return AgentRuntimeFailure(
            code=_TYPE_CODES[error_type], message=message, error_type=error_type
        ).model_dump()
    return AgentRuntimeFailure(code=subtype, message=message, error_type=error_type).model_dump()


FAILURE_TEXT = re.compile(r'Work item (\S+) for member "([^"]+)" failed \(([A-Za-z0-9_]+)\): (.*)', re.S)
"""What :func:`failure_text` writes: groups work item id, member, code, message."""


def failure_text(work_item_id: str | None, member: str, code: str, message: str) -> str:
    """The text a failed work item reports upstream (and an ``ask`` gets as its error):
    ``Work item <id> for member "<member>" failed (<code>): <message>``."""
    return f'Work item {work_item_id} for member "{member}" failed ({code}): {message}'


def no_reply_failure(member: str) -> dict[str, Any]:
    """The failure of a member run that ended without ``team_reply`` or ``team_followup``."""
    return AgentRuntimeFailure(
        code="no_reply",
        message=(
            f'member "{member}" ended its run without calling team_reply or team_followup; '
            "the work item was marked failed"
        ),
        error_type=None,
    ).model_dump()


__all__ = [
    "FAILURE_TEXT",
    "AgentMessageEvent",
    "AgentRuntimeFailure",
    "TeamAgentEvent",
    "TeamEvent",
    "TeamMessageEvent",
    "TeamMessageSubtype",
    "failure_from_exception",
    "failure_from_result",
    "failure_text",
    "no_reply_failure",
]
