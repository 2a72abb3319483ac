"""What a tool call gives back: ``ToolResult``, the handler's ``ToolContext``, and
the normalisation of a handler's return value.

A handler returns one of:

* a ``str`` -- the tool_result text;
* a ``list`` of Anthropic content blocks (dicts with a ``type``);
* a :class:`ToolResult`;
* a ``dict`` with the keys of :class:`ToolResult` (``content`` required).

Tools themselves are defined in :mod:`lattice_worker.tools.tool_definition`
and built with :func:`lattice_worker.tools.tool.tool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ToolExecutionError

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal


@dataclass
class ToolResult:
    """What a handler may return.

    Attributes:
        content: the tool_result content: text, or a list of content blocks (dicts).
        end_turn: end the run after this batch with subtype ``"success"`` instead of
            calling the model again; the first ``end_turn`` result of a batch (in
            tool_use order) gives the result text.
        structured_result: carried to ``ResultMessage.structured_result`` only when
            ``end_turn`` is true; ignored otherwise.
        is_error: the call failed: the ``tool_result`` block carries
            ``is_error: true`` and ``content`` exactly as given (no ``"Error: "``
            prefix is added, unlike a raised exception), so a tool can pin the
            error text the model sees (e.g. ``child_output_invalid: ...``). An
            error result never ends the turn: ``end_turn`` and
            ``structured_result`` are ignored.
    """

    content: str | list[dict[str, Any]]
    end_turn: bool = False
    structured_result: Any = None
    is_error: bool = False


@dataclass
class ToolContext:
    """The optional second argument of a handler.

    Attributes:
        tool_use_id: id of the ``tool_use`` block being answered.
        tool_name: the tool's registered name.
        signal: the query's :class:`~lattice_worker.agent.abort.AbortSignal`; it is
            aborted when the query's ``signal`` is.
        runtime: the query's ``runtime`` option (team / distributed runtimes), or ``None``.
        agent: the :class:`~lattice_worker.agent.agent.Agent` running the call.
        effect_key: the call's idempotency key (a str): the same for every attempt
            of this one call -- after a crash, a re-claim or a recovery on another
            worker -- and different for every other call. Send it to your provider
            as its idempotency key (``effect="idempotent"``) and look it up in
            ``Reconcile.lookup`` (``effect="reconcilable"``). ``None`` only for a
            context built by hand.
    """

    tool_use_id: str
    tool_name: str
    signal: AbortSignal | None = None
    runtime: Any = None
    agent: Any = None
    effect_key: str | None = None


def content_text(content: Any) -> str:
    """The text of a message or tool_result ``content``: the str itself, or the
    ``text`` of its text blocks joined; ``""`` for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _check_blocks(name: str, blocks: list[Any]) -> list[dict[str, Any]]:
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ToolExecutionError(
                f'tool "{name}" returned a content list whose item {i} is not a content block '
                f'(a dict with a "type")'
            )
    return blocks


def normalize_tool_output(name: str, value: Any) -> ToolResult:
    """Turn a handler's return value into a :class:`ToolResult` (see module doc).

    Raises :class:`ToolExecutionError` for anything else (``None`` included), and
    for an ``end_turn`` or ``is_error`` that is not a bool.
    """
    if isinstance(value, ToolResult):
        content = value.content
        if isinstance(content, list):
            _check_blocks(name, content)
        elif not isinstance(content, str):
            raise ToolExecutionError(
                f'tool "{name}" returned ToolResult.content of type {type(content).__name__}; '
                "expected a str or a list of content blocks"
            )
        for flag in ("end_turn", "is_error"):
            # "false" or 0 must not end a run (or fail a call) by being truthy
            if not isinstance(getattr(value, flag), bool):
                raise ToolExecutionError(
                    f'tool "{name}" returned {flag}={getattr(value, flag)!r}; {flag} must be True or False'
                )
        return value
    if isinstance(value, str):
        return ToolResult(content=value)
    if isinstance(value, list):
        return ToolResult(content=_check_blocks(name, value))
    if isinstance(value, dict):
        extra = set(value) - {"content", "end_turn", "structured_result", "is_error"}
        if "content" not in value or extra:
            raise ToolExecutionError(
                f'tool "{name}" returned a dict with keys {sorted(value)}; a result dict needs "content" '
                'and may have "end_turn", "structured_result" and "is_error" only'
            )
        return normalize_tool_output(
            name,
            ToolResult(
                content=value["content"],
                end_turn=value.get("end_turn", False),
                structured_result=value.get("structured_result"),
                is_error=value.get("is_error", False),
            ),
        )
    raise ToolExecutionError(
        f'tool "{name}" returned {type(value).__name__}; return a str, a list of content blocks, '
        "a ToolResult or a dict with a content key"
    )


__all__ = ["ToolContext", "ToolResult", "content_text", "normalize_tool_output"]
