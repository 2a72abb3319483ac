"""The agent loop: agents, options, events, the model boundary, scripted model.

Design: docs/architecture.md, "Core model"; options: docs/configure.md. The
Anthropic client lives in :mod:`.anthropic_client`; ``AnthropicModelClient``
is exported here lazily (module ``__getattr__``), so importing this package
does not import the ``anthropic`` SDK until the name is used.
"""

from typing import TYPE_CHECKING, Any

from .abort import AbortController, AbortSignal
from .agent import Agent, AgentSpec, create_agent, create_bare_agent, define_agent, is_agent_spec
from .compaction import DEFAULT_COMPACTION_PROMPT
from .events import (
    AssistantMessage,
    ResultMessage,
    SDKMessage,
    StreamEvent,
    SystemMessage,
    UserMessage,
    parse_sdk_message,
)
from .hooks import AgentHooks, ModelRequestHookContext, ToolResultHookContext, create_composite_agent_hooks
from .loop import SuspendQuery, ToolBatchOutcome
from .model import AssistantModelMessage, ModelClient, ModelRequest, TokenUsage
from .oneshot import query
from .options import AgentOptions, AutoCompactOptions, QueryOptions, ToolConcurrencyOptions
from .output import SUBMIT_OUTPUT_TOOL_NAME
from .result_limits import DEFAULT_MAX_TOOL_RESULT_CHARS
from .scripted import ScriptedModelClient, ScriptExhaustedError, error_turn, text_turn, tool_turn
from .tool_batch import PermissionRequest, ToolBatchPolicyContext

if TYPE_CHECKING:
    from .anthropic_client import AnthropicModelClient

__all__ = [
    "DEFAULT_COMPACTION_PROMPT",
    "DEFAULT_MAX_TOOL_RESULT_CHARS",
    "SUBMIT_OUTPUT_TOOL_NAME",
    "AbortController",
    "AbortSignal",
    "Agent",
    "AgentHooks",
    "AgentOptions",
    "AgentSpec",
    "AnthropicModelClient",
    "AssistantMessage",
    "AssistantModelMessage",
    "AutoCompactOptions",
    "ModelClient",
    "ModelRequest",
    "ModelRequestHookContext",
    "PermissionRequest",
    "QueryOptions",
    "ResultMessage",
    "SDKMessage",
    "ScriptExhaustedError",
    "ScriptedModelClient",
    "StreamEvent",
    "SuspendQuery",
    "SystemMessage",
    "TokenUsage",
    "ToolBatchOutcome",
    "ToolBatchPolicyContext",
    "ToolConcurrencyOptions",
    "ToolResultHookContext",
    "UserMessage",
    "create_agent",
    "create_bare_agent",
    "create_composite_agent_hooks",
    "define_agent",
    "error_turn",
    "is_agent_spec",
    "parse_sdk_message",
    "query",
    "text_turn",
    "tool_turn",
]


def __getattr__(name: str) -> Any:
    # lazy export: the anthropic SDK is imported on first use only
    if name == "AnthropicModelClient":
        from .anthropic_client import AnthropicModelClient

        return AnthropicModelClient
    raise AttributeError(f"module 'lattice_worker.agent' has no attribute {name!r}")
