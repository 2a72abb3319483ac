"""agent-lattice: agents, tools, hooks, teams (public names: docs/architecture.md, "Public API").

Keep this a plain explicit list; each area appends its own exports.

``AnthropicModelClient`` and the MCP names (``connect_mcp_stdio_server`` ...)
are exported lazily (module ``__getattr__``): importing the ``anthropic`` or
the ``mcp`` SDK costs about a second each, which ``import lattice_worker`` does
not pay until such a name is first used.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent.anthropic_client import AnthropicModelClient

# --- agent loop (lattice_worker.agent) and tools (lattice_worker.tools)
from .agent.abort import AbortController, AbortSignal
from .agent.agent import Agent, AgentSpec, create_agent, create_bare_agent, define_agent, is_agent_spec
from .agent.approvals import PermissionRequest
from .agent.compaction import DEFAULT_COMPACTION_PROMPT
from .agent.events import (
    AssistantMessage,
    ResultMessage,
    SDKMessage,
    StreamEvent,
    SystemMessage,
    UserMessage,
)
from .agent.hooks import (
    AgentHooks,
    ModelRequestHookContext,
    ToolResultHookContext,
    create_composite_agent_hooks,
)
from .agent.loop import SuspendQuery, ToolBatchOutcome
from .agent.model import AssistantModelMessage, ModelClient, ModelRequest, TokenUsage
from .agent.oneshot import query
from .agent.options import AgentOptions, AutoCompactOptions, QueryOptions
from .agent.output import SUBMIT_OUTPUT_TOOL_NAME
from .agent.result_limits import DEFAULT_MAX_TOOL_RESULT_CHARS
from .agent.scripted import ScriptedModelClient, ScriptExhaustedError, error_turn, text_turn, tool_turn
from .agent.tool_batch import ToolBatchPolicyContext
from .errors import (
    AbortError,
    APIError,
    ConcurrentQueryError,
    ConfigError,
    LatticeError,
    MaxTurnsError,
    MissingExtraError,
    MissingOutputError,
    ModelTimeoutError,
    ToolBatchRejectedError,
    ToolExecutionError,
)
from .tools.builtin import create_agent_workspace_tools, create_builtin_tools
from .tools.skills import SkillDefinition, load_skill, skill
from .tools.tool import ToolContext, ToolDefinition, ToolResult, tool

__all__ = [
    # agent loop
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
    "ToolResultHookContext",
    "UserMessage",
    "create_agent",
    "create_bare_agent",
    "create_composite_agent_hooks",
    "define_agent",
    "error_turn",
    "is_agent_spec",
    "query",
    "text_turn",
    "tool_turn",
    # tools
    "SkillDefinition",
    "ToolContext",
    "ToolDefinition",
    "ToolResult",
    "create_agent_workspace_tools",
    "create_builtin_tools",
    "load_skill",
    "skill",
    "tool",
    # errors
    "APIError",
    "AbortError",
    "ConcurrentQueryError",
    "ConfigError",
    "LatticeError",
    "MaxTurnsError",
    "MissingExtraError",
    "MissingOutputError",
    "ModelTimeoutError",
    "ToolBatchRejectedError",
    "ToolExecutionError",
]

# --- history stores (lattice_worker.agent.history_stores) and trace sinks (lattice_worker.tracing)
from .agent.history import HistoryStore  # noqa: E402
from .agent.history_stores import (  # noqa: E402
    RedisHistoryStore,
    create_jsonl_history_store,
    define_history_store,
)
from .tracing import (  # noqa: E402
    ContextTracer,
    TraceContext,
    create_composite_context_tracer,
    create_jsonl_context_tracer,
    create_langfuse_context_tracer,
    create_langsmith_context_tracer,
    create_otel_context_tracer,
    define_context_tracer,
)

__all__ += [
    "ContextTracer",
    "HistoryStore",
    "RedisHistoryStore",
    "TraceContext",
    "create_composite_context_tracer",
    "create_jsonl_context_tracer",
    "create_jsonl_history_store",
    "create_langfuse_context_tracer",
    "create_langsmith_context_tracer",
    "create_otel_context_tracer",
    "define_context_tracer",
    "define_history_store",
]

# --- teams in one process (lattice_worker.team)
from .team import (  # noqa: E402
    DEFAULT_MAX_DELEGATE_DEPTH,
    AgentMessageEvent,
    DrainResult,
    RunnerOptions,
    Team,
    TeamAgentEvent,
    TeamMember,
    TeamMessageEvent,
    TeamResultMessage,
    TeamRunner,
    WorkItemOutcome,
    agent_tool,
    create_team,
    create_team_runner,
    delegate_tool,
    failed_work_items,
    parse_report_message,
    team_member,
)

__all__ += [
    "DEFAULT_MAX_DELEGATE_DEPTH",
    "AgentMessageEvent",
    "DrainResult",
    "RunnerOptions",
    "Team",
    "TeamAgentEvent",
    "TeamMember",
    "TeamMessageEvent",
    "TeamResultMessage",
    "TeamRunner",
    "WorkItemOutcome",
    "agent_tool",
    "create_team",
    "create_team_runner",
    "delegate_tool",
    "failed_work_items",
    "parse_report_message",
    "team_member",
]

# --- tool effects (lattice_worker.tools.effects; docs/tool-effects.md)
from .agent.approvals import ApprovalRequest  # noqa: E402
from .tools.effects import (  # noqa: E402
    LookupFound,
    LookupNotFound,
    LookupUnknown,
    Reconcile,
    effect_from_mcp_annotations,
)

__all__ += [
    "ApprovalRequest",
    "LookupFound",
    "LookupNotFound",
    "LookupUnknown",
    "Reconcile",
    "effect_from_mcp_annotations",
]


# --- MCP servers' tools (lattice_worker.tools.mcp), exported lazily: importing the
# mcp SDK costs about a second, paid when one of these names is first used
_MCP_NAMES = (
    "MCPClient",
    "MCPConnectTimeoutError",
    "MCPConnectionError",
    "MCPStdioConnection",
    "MCPStreamableHTTPConnection",
    "connect_mcp_stdio_server",
    "connect_mcp_streamable_http_server",
    "create_mcp_tools",
)
__all__ += list(_MCP_NAMES)


def __getattr__(name: str) -> Any:
    # lazy exports: the anthropic and mcp SDKs are imported on first use only
    if name == "AnthropicModelClient":
        from .agent.anthropic_client import AnthropicModelClient

        return AnthropicModelClient
    if name in _MCP_NAMES:
        from .tools import mcp

        return getattr(mcp, name)
    raise AttributeError(f"module 'lattice_worker' has no attribute {name!r}")
