"""The model-client boundary: what the agent loop sends and what it gets back.

Messages and content blocks use Anthropic's Messages API wire format as plain
dicts (``{"role": "user", "content": [...]}``, ``{"type": "tool_use", ...}``),
so history can be stored as JSON and replayed in another process unchanged.
Design: docs/architecture.md, "Core model".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ..errors import ConfigError

if TYPE_CHECKING:
    from .abort import AbortSignal

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]

ThinkingConfig = dict[str, Any]
"""``{"type": "adaptive"}``, ``{"type": "enabled", "budget_tokens": N}`` or ``{"type": "disabled"}``."""

ReasoningEffort = Literal["low", "high", "max"]

MIN_THINKING_BUDGET_TOKENS = 1024
"""The smallest ``budget_tokens`` the Messages API accepts for ``{"type": "enabled"}`` thinking."""


def capped_thinking_budget(budget: int, max_tokens: int) -> int:
    """The ``budget_tokens`` actually sent: ``budget`` capped at ``max_tokens - 1``
    (thinking tokens count against the output budget, which must leave room
    for the answer).

    Raises:
        ConfigError: the result is below :data:`MIN_THINKING_BUDGET_TOKENS`
            (1,024), the provider's minimum -- raise ``max_tokens`` (above
            1,024) or the budget.
    """
    capped = min(budget, max_tokens - 1)
    if capped < MIN_THINKING_BUDGET_TOKENS:
        if budget < MIN_THINKING_BUDGET_TOKENS:
            why = f"budget_tokens={budget}"
        else:
            why = f"budget_tokens={budget} capped at max_tokens - 1 = {max_tokens - 1}"
        raise ConfigError(
            f"thinking_config: {why} is below the provider's minimum of {MIN_THINKING_BUDGET_TOKENS} "
            f"thinking tokens; use budget_tokens >= {MIN_THINKING_BUDGET_TOKENS} and max_tokens > budget_tokens"
        )
    return capped


@dataclass
class TokenUsage:
    """Token counts of one model request, or summed over a query."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def add(self, other: TokenUsage | dict[str, Any] | None) -> None:
        """Add another usage (a TokenUsage or an Anthropic usage dict) in place."""
        if other is None:
            return
        src = other if isinstance(other, dict) else other.to_dict()
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            value = src.get(key)
            if isinstance(value, int):
                setattr(self, key, getattr(self, key) + value)

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }

    @classmethod
    def from_any(cls, value: TokenUsage | dict[str, Any] | None) -> TokenUsage:
        usage = cls()
        usage.add(value)
        return usage


@dataclass
class ModelRequest:
    """One request from the agent loop to a :class:`ModelClient`.

    Fields:
        model: model name (``None`` lets the client use its default).
        system: the system prompt, or ``None``.
        messages: the conversation, Anthropic wire format (list of ``{"role", "content"}`` dicts).
        tools: ``[{"name", "description", "input_schema"}]`` as the model sees them.
        max_tokens: output budget per request.
        stream: ask the provider for a streamed response.
        thinking: thinking config dict sent as ``thinking`` (``None`` = send nothing).
        reasoning_effort: sent as the top-level ``reasoning_effort`` field (Kimi convention).
        output_format: ``"json"`` or ``{"type": "json_schema", "schema": {...}}``, sent as ``output_config.format``.
        timeout_ms: the per-request deadline in **milliseconds**, or ``None``.
        signal: the query's abort signal; a client may use it to cancel its own work.
        on_stream_event: called with each raw provider stream event (a dict) while streaming.
    """

    model: str | None
    system: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int = 4096
    stream: bool = True
    thinking: ThinkingConfig | None = None
    reasoning_effort: str | None = None
    output_format: Any = None
    timeout_ms: int | None = None
    signal: AbortSignal | None = None
    on_stream_event: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None


@dataclass
class AssistantModelMessage:
    """One assistant turn returned by a model client.

    ``content`` holds content blocks as dicts (``text``, ``tool_use``, ``thinking``
    with its ``signature``...). ``usage`` may be ``None`` when the client does not
    report it (the loop then counts zeros). ``provider_response_id`` and ``model``
    are the provider's response id and the model that actually served the reply.
    """

    content: list[dict[str, Any]]
    usage: TokenUsage | dict[str, Any] | None = None
    stop_reason: str | None = None
    provider_response_id: str | None = None
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The message as a JSON-ready dict (``role`` is always ``assistant``)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.usage is not None:
            out["usage"] = TokenUsage.from_any(self.usage).to_dict()
        if self.stop_reason is not None:
            out["stop_reason"] = self.stop_reason
        if self.provider_response_id is not None:
            out["provider_response_id"] = self.provider_response_id
        if self.model is not None:
            out["model"] = self.model
        return out


@runtime_checkable
class ModelClient(Protocol):
    """Anything that turns a :class:`ModelRequest` into an :class:`AssistantModelMessage`.

    Raise :class:`~lattice_worker.errors.APIError` for provider failures.
    """

    async def create_message(self, request: ModelRequest) -> AssistantModelMessage: ...


__all__ = [
    "MIN_THINKING_BUDGET_TOKENS",
    "AssistantModelMessage",
    "ModelClient",
    "ModelRequest",
    "ReasoningEffort",
    "StopReason",
    "ThinkingConfig",
    "TokenUsage",
    "capped_thinking_budget",
]
