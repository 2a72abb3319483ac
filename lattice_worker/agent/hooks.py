"""Agent hooks: rewrite tool results and outgoing model requests.

Rules:

* Return, do not mutate. ``None`` keeps the value. Hooks get deep copies, so
  editing the context in place changes nothing (in a composite, each hook gets
  its own copy of the value so far).
* ``on_tool_result(ctx)`` runs for every tool result on its way back to the
  model (successes, failures, calls cancelled by an abort, calls blocked by a
  policy or a permission) and may return a replacement ``tool_result`` block --
  e.g. flipping ``is_error``. It cannot add or drop calls: the replacement must
  answer the same ``tool_use_id``.
* ``on_model_request(ctx)`` runs before each model request and may return
  ``{"messages": [...]}`` and/or ``{"system_prompt": "..."}``; it shapes that one
  request only, never the stored history.
* A hook that raises propagates out of ``query()`` / ``prompt()``; so does the
  :class:`ConfigError` for a hook returning a bad shape (an ``on_tool_result``
  block whose ``content`` is not a str or a list of content blocks, or whose
  ``is_error`` is not a bool, included).
* Hooks run before the matching trace event, so traces show what was sent.
* Hooks may be sync or async.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass
class ToolResultHookContext:
    """Input of ``on_tool_result``.

    Attributes:
        tool_name: the name the model called.
        tool_use_id: the ``tool_use`` id being answered.
        input: the raw input the model sent (untrusted).
        result: the ``tool_result`` block the SDK would send (a dict, Anthropic wire format).
        error: the exception when the call failed (handler error, invalid input,
            permission denial, policy rejection, abort), else ``None``.
    """

    tool_name: str
    tool_use_id: str
    input: Any
    result: dict[str, Any]
    error: BaseException | None = None


@dataclass
class ModelRequestHookContext:
    """Input of ``on_model_request``.

    Attributes:
        messages: the messages about to be sent (a copy; editing it changes nothing).
        system_prompt: the system prompt about to be sent, or ``None``.
        turn: the 1-based model request number within the query.
    """

    messages: list[dict[str, Any]]
    system_prompt: str | None
    turn: int


ToolResultHook = Callable[[ToolResultHookContext], "dict[str, Any] | None | Awaitable[dict[str, Any] | None]"]
ModelRequestHook = Callable[
    [ModelRequestHookContext], "Mapping[str, Any] | None | Awaitable[Mapping[str, Any] | None]"
]


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass(frozen=True)
class AgentHooks:
    """Lifecycle callbacks for one Agent (``create_agent(hooks=AgentHooks(...))``).

    ``on_tool_result(ctx: ToolResultHookContext) -> None | dict`` and
    ``on_model_request(ctx: ModelRequestHookContext) -> None | {"messages"?, "system_prompt"?}``;
    either may be omitted. Raises :class:`ConfigError` when a given hook is not callable.
    """

    on_tool_result: ToolResultHook | None = None
    on_model_request: ModelRequestHook | None = None

    def __post_init__(self) -> None:
        for field in ("on_tool_result", "on_model_request"):
            fn = getattr(self, field)
            if fn is not None and not callable(fn):
                raise ConfigError(f"AgentHooks: {field} must be callable, got {type(fn).__name__}")

    async def run_tool_result(self, ctx: ToolResultHookContext) -> dict[str, Any]:
        """Apply ``on_tool_result``; returns the block to send (validated).

        The hook gets deep copies of ``result`` and ``input``: editing them in place
        changes nothing; ``None`` keeps ``ctx.result`` as it was."""
        if self.on_tool_result is None:
            return ctx.result
        replaced = await _maybe_await(self.on_tool_result(_private_tool_result_context(ctx)))
        if replaced is None:
            return ctx.result
        return _check_tool_result_block(replaced, ctx.tool_use_id)

    async def run_model_request(
        self, ctx: ModelRequestHookContext
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Apply ``on_model_request``; returns ``(messages, system_prompt)`` for this request.

        The hook gets a deep copy of ``messages``: editing it in place changes
        nothing; ``None`` keeps ``ctx.messages`` as they were."""
        if self.on_model_request is None:
            return ctx.messages, ctx.system_prompt
        replaced = await _maybe_await(self.on_model_request(_private_model_request_context(ctx)))
        return _apply_model_request_result(replaced, ctx.messages, ctx.system_prompt)


def _private_tool_result_context(ctx: ToolResultHookContext) -> ToolResultHookContext:
    return dataclasses.replace(ctx, result=copy.deepcopy(ctx.result), input=copy.deepcopy(ctx.input))


def _private_model_request_context(ctx: ModelRequestHookContext) -> ModelRequestHookContext:
    return dataclasses.replace(ctx, messages=copy.deepcopy(ctx.messages))


def _check_tool_result_block(block: Any, tool_use_id: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") != "tool_result":
        raise ConfigError(
            f"on_tool_result hook must return None or a tool_result block dict "
            f'({{"type": "tool_result", ...}}), got {block!r}'
        )
    got = block.get("tool_use_id", tool_use_id)
    if got != tool_use_id:
        raise ConfigError(
            f"on_tool_result hook returned a block for tool_use_id {got!r} while answering {tool_use_id!r}; "
            "a hook cannot add, drop or re-route tool calls"
        )
    if "content" in block:
        content = block["content"]
        if not (
            isinstance(content, str)
            or (
                isinstance(content, list)
                and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)
            )
        ):
            raise ConfigError(
                "on_tool_result hook returned a tool_result whose content must be a str or a list of "
                f'content blocks (dicts with a "type"), got {content!r:.120}'
            )
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise ConfigError(
            f"on_tool_result hook returned a tool_result whose is_error must be True or False, "
            f"got {block['is_error']!r}"
        )
    if "tool_use_id" not in block:
        block = {**block, "tool_use_id": tool_use_id}
    return block


def _apply_model_request_result(
    replaced: Any, messages: list[dict[str, Any]], system_prompt: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    if replaced is None:
        return messages, system_prompt
    if not isinstance(replaced, Mapping):
        raise ConfigError(
            f'on_model_request hook must return None or a dict with "messages" and/or "system_prompt", got {replaced!r}'
        )
    extra = set(replaced) - {"messages", "system_prompt"}
    if extra:
        raise ConfigError(f"on_model_request hook returned unknown keys {sorted(extra)}")
    if "messages" in replaced:
        new_messages = replaced["messages"]
        if not isinstance(new_messages, list) or not all(isinstance(m, dict) for m in new_messages):
            raise ConfigError("on_model_request hook: messages must be a list of message dicts")
        messages = new_messages
    if "system_prompt" in replaced:
        new_system = replaced["system_prompt"]
        if new_system is not None and not isinstance(new_system, str):
            raise ConfigError("on_model_request hook: system_prompt must be a str or None")
        system_prompt = new_system
    return messages, system_prompt


def coerce_hooks(value: Any) -> AgentHooks | None:
    """Accept an :class:`AgentHooks`, a dict with its keys, any object with those
    attributes, or ``None``. Raises :class:`ConfigError` otherwise."""
    if value is None or isinstance(value, AgentHooks):
        return value
    if isinstance(value, Mapping):
        extra = set(value) - {"on_tool_result", "on_model_request"}
        if extra:
            raise ConfigError(
                f"hooks: unknown hook {sorted(extra)[0]!r}; expected on_tool_result, on_model_request"
            )
        return AgentHooks(**value)
    if hasattr(value, "on_tool_result") or hasattr(value, "on_model_request"):
        return AgentHooks(
            on_tool_result=getattr(value, "on_tool_result", None),
            on_model_request=getattr(value, "on_model_request", None),
        )
    raise ConfigError(f"hooks: expected AgentHooks, a dict of hooks or None, got {type(value).__name__}")


def create_composite_agent_hooks(hooks: Sequence[AgentHooks | Mapping[str, Any] | None]) -> AgentHooks:
    """Chain several hook sets in list order.

    Each hook receives the previous one's output (a hook returning ``None`` passes
    the value on unchanged); ``None`` entries are skipped. Raises
    :class:`ConfigError` when an entry is not a hook set.
    """
    if isinstance(hooks, AgentHooks | Mapping) or not isinstance(hooks, Sequence):
        raise ConfigError("create_composite_agent_hooks: expected a list of AgentHooks")
    members = [h for h in (coerce_hooks(x) for x in hooks) if h is not None]
    tool_fns = [h.on_tool_result for h in members if h.on_tool_result is not None]
    request_fns = [h.on_model_request for h in members if h.on_model_request is not None]

    async def on_tool_result(ctx: ToolResultHookContext) -> dict[str, Any] | None:
        current = ctx.result
        changed = False
        for fn in tool_fns:
            out = await _maybe_await(
                fn(_private_tool_result_context(dataclasses.replace(ctx, result=current)))
            )
            if out is not None:
                current = _check_tool_result_block(out, ctx.tool_use_id)
                changed = True
        return current if changed else None

    async def on_model_request(ctx: ModelRequestHookContext) -> dict[str, Any] | None:
        messages, system_prompt = ctx.messages, ctx.system_prompt
        changed = False
        for fn in request_fns:
            out = await _maybe_await(
                fn(
                    _private_model_request_context(
                        dataclasses.replace(ctx, messages=messages, system_prompt=system_prompt)
                    )
                )
            )
            if out is not None:
                messages, system_prompt = _apply_model_request_result(out, messages, system_prompt)
                changed = True
        return {"messages": messages, "system_prompt": system_prompt} if changed else None

    return AgentHooks(
        on_tool_result=on_tool_result if tool_fns else None,
        on_model_request=on_model_request if request_fns else None,
    )


__all__ = [
    "AgentHooks",
    "ModelRequestHookContext",
    "ToolResultHookContext",
    "coerce_hooks",
    "create_composite_agent_hooks",
]
