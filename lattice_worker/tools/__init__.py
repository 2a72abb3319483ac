"""Tools: ``tool()`` / ``@tool``, ``ToolDefinition``, ``ToolResult``, ``ToolContext``.

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
