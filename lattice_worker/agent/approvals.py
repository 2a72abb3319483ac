"""Who may let a tool call run: the ``permission`` callback and, under
``permission_mode="by_effect"``, the approval step (``docs/tool-effects.md``).

``permission_mode="allow"`` (the default): every registered tool may run; a
``permission`` callback, when given, decides each call.

``permission_mode="by_effect"``: a call of a ``read_only`` tool runs without
asking anyone (the ``permission`` callback included). Every other call needs
an approval first:

1. the ``permission`` callback, when given, is asked (a deny is final);
2. then the query's runtime, when it offers ``approve_tool_call(request)``
   (sync or async, returning a permission decision): the distributed runtime
   records a pending approval and suspends the query
   (:class:`~lattice_worker.agent.suspend.SuspendQuery`) until a person
   approves or denies it, holding no worker meanwhile;
3. with neither a callback nor an approving runtime -- an agent queried in
   this process without a ``permission`` callback -- nobody can approve, and
   the call is denied with a message naming the rule.

The tools a runtime gives an agent for its own protocol (team mailbox and
member tools, ``submit_output``, ``tool_search``) never need an approval.
A denial reaches the model as an ``is_error`` tool result carrying the reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..tools.tool import ToolDefinition
from .suspend import SuspendQuery


@dataclass
class PermissionRequest:
    """What a ``permission`` callback receives (docs/tool-effects.md, "Approvals by effect").

    ``input`` is the raw, unvalidated input the model sent. ``effect`` (the
    tool's effect) and ``effect_key`` (the call's idempotency key) are there
    for callbacks that decide by them.
    """

    tool_name: str
    input: Any
    tool_use_id: str
    effect: str = "unguarded"
    effect_key: str | None = None


ApprovalRequest = PermissionRequest
"""What ``runtime.approve_tool_call`` receives: the same shape."""

_RUNTIME_TOOL_FLAGS = ("team_tool", "team_member_tool", "tool_search")


def is_runtime_tool(tool: ToolDefinition) -> bool:
    """True for the tools a runtime gives an agent for its own protocol
    (``agent_tool`` kinds, team mailbox and member tools, ``tool_search``):
    they need no approval and are not journaled (the runtime makes them safe itself)."""
    if tool.kind == "agent_tool":
        return True
    metadata = tool.metadata or {}
    return any(metadata.get(flag) is True for flag in _RUNTIME_TOOL_FLAGS)


def needs_approval(tool: ToolDefinition) -> bool:
    """True when a call of ``tool`` needs an approval under ``by_effect``:
    the tool is not ``read_only`` and not a runtime tool (:func:`is_runtime_tool`;
    ``submit_output`` is exempted by the batch itself)."""
    return tool.effect != "read_only" and not is_runtime_tool(tool)


def no_approver_message(tool: ToolDefinition) -> str:
    return (
        f'Permission denied for tool "{tool.name}": under permission_mode="by_effect" a call of a tool whose '
        f'effect is "{tool.effect}" (not "read_only") needs an approval, and nothing here can give one '
        "(no permission callback, and the runtime takes no approvals). The call was not run."
    )


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def read_decision(decision: Any, tool_name: str, source: str) -> str | None:
    """``None`` for an allow, else the denial text. A malformed answer denies
    (fail closed) with a message saying what came back."""
    behavior = decision.get("behavior") if isinstance(decision, dict) else getattr(decision, "behavior", None)
    if behavior == "allow":
        return None
    if behavior == "deny":
        message = (
            decision.get("message") if isinstance(decision, dict) else getattr(decision, "message", None)
        )
        return str(message) if message else f'Permission denied for tool "{tool_name}".'
    return (
        f'{source} for tool "{tool_name}" returned {decision!r}, not '
        "{'behavior': 'allow'} or {'behavior': 'deny', 'message': ...}; the call was not run."
    )


async def check_permission(
    permission: Callable[[PermissionRequest], Any], request: PermissionRequest
) -> str | None:
    """Ask the ``permission`` callback; ``None`` when allowed, else the denial
    message (a raising or malformed callback denies)."""
    try:
        decision = await _maybe_await(permission(request))
    except Exception as exc:
        return (
            f'Permission check for tool "{request.tool_name}" failed ({type(exc).__name__}: {exc}); '
            "the call was not run."
        )
    return read_decision(decision, request.tool_name, "Permission check")


async def check_call(
    tool: ToolDefinition,
    request: PermissionRequest,
    *,
    mode: str,
    permission: Callable[[PermissionRequest], Any] | None,
    runtime: Any,
    exempt: bool = False,
) -> str | None:
    """The permission / approval step of one call (module doc): ``None`` when
    the call may run, else the denial message. ``exempt``: the call is the
    loop's own ``submit_output`` (never asked about). Raises
    :class:`SuspendQuery` when the runtime suspends the query to wait for a person."""
    if exempt:
        return None
    if mode != "by_effect":
        return None if permission is None else await check_permission(permission, request)
    if not needs_approval(tool):
        return None
    approve = getattr(runtime, "approve_tool_call", None) if runtime is not None else None
    if permission is None and approve is None:
        return no_approver_message(tool)
    if permission is not None:
        denied = await check_permission(permission, request)
        if denied is not None:
            return denied
    if approve is None:
        return None
    try:
        decision = await _maybe_await(approve(request))
    except SuspendQuery:
        raise
    except Exception as exc:
        return (
            f'The approval of tool "{tool.name}" failed ({type(exc).__name__}: {exc}); the call was not run.'
        )
    return read_decision(decision, tool.name, "The approval")


__all__ = [
    "ApprovalRequest",
    "PermissionRequest",
    "check_call",
    "check_permission",
    "is_runtime_tool",
    "needs_approval",
    "no_approver_message",
    "read_decision",
]
