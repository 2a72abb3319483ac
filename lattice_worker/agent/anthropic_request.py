"""The Messages API request of :class:`~lattice_worker.agent.anthropic_client.AnthropicModelClient`:
a :class:`~lattice_worker.agent.model.ModelRequest` as the keyword arguments of
``AsyncAnthropic.messages.create``.

The wire format of ``thinking``, ``reasoning_effort``, ``output_format`` and
``timeout_ms`` is the table in :mod:`lattice_worker.agent.anthropic_client`.
Every function raises :class:`~lattice_worker.errors.ConfigError` for a
malformed field and sends nothing.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .model import ModelRequest, capped_thinking_budget

REASONING_EFFORTS = ("low", "high", "max")
THINKING_TYPES = ("enabled", "adaptive", "disabled")


def build_request_params(request: ModelRequest, *, default_model: str) -> dict[str, Any]:
    """The keyword arguments for ``AsyncAnthropic.messages.create`` (without ``stream``).

    Raises:
        ConfigError: a request field of the wrong type or value.
    """
    max_tokens = request.max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive int, got {max_tokens!r}")
    if not isinstance(request.messages, list):
        raise ConfigError(f"messages must be a list, got {type(request.messages).__name__}")
    params: dict[str, Any] = {
        "model": request.model or default_model,
        "max_tokens": max_tokens,
        "messages": [_wire_message(m, i) for i, m in enumerate(request.messages)],
    }
    if request.system:
        params["system"] = request.system
    if request.tools:
        params["tools"] = list(request.tools)

    extra: dict[str, Any] = {}
    thinking = serialize_thinking(request.thinking, max_tokens)
    if thinking is not None:
        extra["thinking"] = thinking
    effort = serialize_reasoning_effort(request.reasoning_effort)
    if effort is not None:
        extra["reasoning_effort"] = effort
    output_config = serialize_output_format(request.output_format)
    if output_config is not None:
        extra["output_config"] = output_config
    if extra:
        params["extra_body"] = extra

    timeout_ms = request.timeout_ms
    if timeout_ms is not None:
        if not isinstance(timeout_ms, int | float) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            raise ConfigError(f"timeout_ms must be a positive number of milliseconds, got {timeout_ms!r}")
        params["timeout"] = timeout_ms / 1000
    return params


def _wire_message(message: Any, index: int) -> dict[str, Any]:
    """Only ``role`` and ``content`` go on the wire (history entries may carry usage or ids)."""
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ConfigError(f"messages[{index}] must be a dict with 'role' and 'content', got {message!r:.200}")
    return {"role": message["role"], "content": message["content"]}


def serialize_thinking(config: Any, max_tokens: int) -> dict[str, Any] | None:
    """Map a thinking config to the wire ``thinking`` object.

    ``{"type": "enabled", "budget_tokens": N}`` (or ``budgetTokens``) becomes
    ``{"type": "enabled", "budget_tokens": min(N, max_tokens - 1)}``;
    ``{"type": "adaptive"}`` and ``{"type": "disabled"}`` are sent as they are;
    ``None`` sends nothing. Other keys of the config pass through unchanged.

    Raises:
        ConfigError: not a dict, an unknown ``type``, a missing / non-positive
            budget, or a capped budget below the provider's minimum of 1,024 tokens.
    """
    if config is None:
        return None
    if hasattr(config, "model_dump"):
        config = config.model_dump(exclude_none=True)
    if not isinstance(config, dict):
        raise ConfigError(f"thinking_config must be a dict like {{'type': 'adaptive'}}, got {config!r}")
    kind = config.get("type")
    if kind not in THINKING_TYPES:
        raise ConfigError(f"thinking_config type must be one of {THINKING_TYPES}, got {kind!r}")
    out = {k: v for k, v in config.items() if k not in ("budget_tokens", "budgetTokens")}
    if kind == "enabled":
        budget = config.get("budget_tokens", config.get("budgetTokens"))
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(
                f"thinking_config {{'type': 'enabled'}} needs budget_tokens as a positive int, got {budget!r}"
            )
        out["budget_tokens"] = capped_thinking_budget(budget, max_tokens)
    return out


def serialize_reasoning_effort(effort: Any) -> str | None:
    """Validate ``reasoning_effort`` (sent as the top-level ``reasoning_effort`` field).

    Raises:
        ConfigError: not one of ``"low"``, ``"high"``, ``"max"``.
    """
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise ConfigError(f"reasoning_effort must be one of {REASONING_EFFORTS}, got {effort!r}")
    return str(effort)


def serialize_output_format(output_format: Any) -> dict[str, Any] | None:
    """Map ``output_format`` to the wire ``output_config`` object.

    ``"json"`` -> ``{"format": {"type": "json_schema", "schema": {"type": "object"}}}``;
    ``{"type": "json_schema", "schema": S}`` -> ``{"format": {"type": "json_schema", "schema": S}}``.

    Raises:
        ConfigError: anything else, or a schema that is not a dict.
    """
    if output_format is None:
        return None
    if output_format == "json":
        return {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    if isinstance(output_format, dict) and output_format.get("type") == "json_schema":
        schema = output_format.get("schema")
        if not isinstance(schema, dict):
            raise ConfigError(f"output_format json_schema needs 'schema' as a dict, got {schema!r}")
        return {"format": dict(output_format)}
    raise ConfigError(
        f"output_format must be 'json' or {{'type': 'json_schema', 'schema': {{...}}}}, got {output_format!r}"
    )


__all__ = [
    "REASONING_EFFORTS",
    "THINKING_TYPES",
    "build_request_params",
    "serialize_output_format",
    "serialize_reasoning_effort",
    "serialize_thinking",
]
