"""Tools: ``tool()`` / ``@tool``, ``ToolDefinition``, ``ToolResult``, ``ToolContext``
(:mod:`.tool`); the built-in workspace tools (:mod:`.builtin`); skills (:mod:`.skills`).

Spec: AgentLattice "Tools". See :mod:`.tool`.
"""

from .tool import (
    TOOL_NAME_PATTERN,
    ToolContext,
    ToolDefinition,
    ToolInputError,
    ToolResult,
    tool,
)

__all__ = [
    "TOOL_NAME_PATTERN",
    "ToolContext",
    "ToolDefinition",
    "ToolInputError",
    "ToolResult",
    "tool",
]
